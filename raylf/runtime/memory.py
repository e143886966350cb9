"""A worker process's memory: its peak, and an allocator that keeps what training frees.

glibc's malloc hands the top of its heap back to the kernel once more than a few MiB of it are
free, and a training step frees its activations (megabytes each for a small CNN) at its end, so
the next step faults the same pages in again and the kernel zeroes each one. Measured here
(heavy benchmark CNN, batch 32, one thread, channels-last; six pairs of processes side by side):
600–2,500 page faults per step, 10–28 % of the step's CPU time in the kernel; keeping the freed
memory left 1–3 faults per step and 11.1 ms of CPU per step on average against 14.0 ms.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import resource

import torch

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks below this come from the heap and are reused; larger ones (a big evaluation batch) are
# mapped and unmapped as before. 32 MiB is the largest threshold glibc's own adaptation picks.
MMAP_THRESHOLD_BYTES = 32 * 2**20
# Free memory the heap may keep at its top: above a step's heap blocks for the models here, and
# small beside the million-client run's 8 GiB bound (7.39 GiB in all processes with it,
# benchmarks/records/2026-12-02-cpu-million-ff068cb.json).
TRIM_THRESHOLD_BYTES = 256 * 2**20


_keeping = False


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library, looked up once a process: ``find_library`` runs ``ldconfig`` each time,
    which a sweep's trial process paid at every trial (5 % of a tiny one)."""
    return ctypes.CDLL(ctypes.util.find_library("c"))


def keeping_freed_memory() -> bool:
    """Whether ``keep_freed_memory`` took effect in this process."""
    return _keeping


def keep_freed_memory() -> bool:
    """Let this process's allocator keep freed memory for the next step instead of returning it
    to the kernel; True where that applies (glibc), False elsewhere (nothing changes).

    Called once the process's data is resident (setting up frees large temporaries that should
    go back): a worker keeping its setup's garbage measured 200 MiB more over the two workers of
    the million-client run. Process-wide, so only the processes raylf starts for training call
    it (Ray workers); a driver, and the local backend in it, keep their allocator as it is.
    """
    try:
        libc = _libc()
        mallopt, malloc_trim = libc.mallopt, libc.malloc_trim
    except (OSError, TypeError, AttributeError):  # no C library found, or not glibc's
        return False
    global _keeping
    malloc_trim(0)  # what was freed before (setting up) goes back now, as it would have
    _keeping = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                    and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return _keeping


def peak_memory(device: torch.device) -> int:
    """Peak bytes this worker has held since it started or ``reset_peak_memory``: the device's
    allocator peak on a GPU, else the process's peak resident set (the worker is its own
    process on Ray)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status
                        if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def reset_peak_memory() -> None:
    """Start ``peak_memory`` again from what is held now (Linux's clear_refs code 5 resets the
    resident-set high-water mark; elsewhere the process's peak stays)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass
