"""The sweep lease (raylf.sweep.lease): taken atomically, named when held, renewed, and taken
over once stale, on a local disk and on S3 (moto's server on loopback). Staleness is decided
by an injected clock or by records written as a dead driver leaves them, never by waiting.
The drivers themselves: tests/faults/test_sweep_lease.py and tests/test_s3_storage.py."""

from __future__ import annotations

import json
import os
import socket
import threading
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from raylf.sweep import cli as sweep_cli
from raylf.sweep.lease import FOLDER, Holder, LeaseHeld, acquire
from tests.test_sweep import write_sweep


def never_lost() -> None:
    raise AssertionError("the lease was reported lost")


def records(root: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((root / FOLDER).glob("*.json"))}


def place(root: Path, generation: int, holder: Holder) -> None:
    """A record as a driver leaves it (a killed driver does not release its lease)."""
    (root / FOLDER).mkdir(parents=True, exist_ok=True)
    (root / FOLDER / f"{generation:08d}.json").write_text(json.dumps(asdict(holder)))


def elsewhere(renewed: float, expiry_s: float = 60.0) -> Holder:
    """A driver on another host, last renewed at ``renewed``."""
    return Holder("0123456789ab", "another-host", 4242, renewed - 100, "theirs", renewed,
                  expiry_s)


def test_of_drivers_racing_for_a_free_lease_exactly_one_takes_it(tmp_path):
    root = tmp_path / "sweep"
    start = threading.Barrier(8)
    outcomes: list = []

    def race() -> None:
        start.wait()
        try:
            outcomes.append(acquire(str(root), "s", on_lost=never_lost)[0])
        except LeaseHeld as held:
            outcomes.append(held)

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (lease,) = [o for o in outcomes if not isinstance(o, LeaseHeld)]
    assert len(outcomes) == 8 and lease.generation == 1
    assert list(records(root)) == ["00000001.json"]
    lease.release()
    assert records(root)["00000001.json"]["released"] is True
    following, taken = acquire(str(root), "s", on_lost=never_lost)  # free again at once
    assert following.generation == 2 and taken is None
    assert list(records(root)) == ["00000002.json"]
    following.release()


def test_a_live_holder_is_named_with_since_when_and_its_expiry(tmp_path):
    root = tmp_path / "sweep"
    lease, _ = acquire(str(root), "0123456789ab", expiry=90.0, on_lost=never_lost)
    try:
        with pytest.raises(LeaseHeld) as held:
            acquire(str(root), "ba9876543210", on_lost=never_lost)
    finally:
        lease.release()
    msg = str(held.value)
    assert msg.startswith(f"invalid spec:\n  --storage: {root} is in use by another sweep "
                          f"driver: driver pid {os.getpid()} on host {socket.gethostname()} "
                          "(another sweep, 0123456789ab), running since 20")
    assert "Wait until it ends or stop it" in msg and "90 s after its last renewal" in msg


def test_a_stale_lease_is_taken_over_and_a_live_one_from_another_host_is_not(tmp_path):
    root = tmp_path / "sweep"
    # on this host: this very pid, but a process that started at another time (a pid reused
    # after the driver died) does not hold the lease
    dead = replace(Holder.this_driver("s", 60.0, 1000.0), started=1.0)
    place(root, 3, dead)
    lease, taken = acquire(str(root), "s", clock=lambda: 1000.0, on_lost=never_lost)
    assert taken == dead and lease.generation == 4
    assert list(records(root)) == ["00000004.json"]  # older generations removed
    lease.release()

    other = tmp_path / "other"
    place(other, 7, elsewhere(renewed=5000.0))
    with pytest.raises(LeaseHeld, match="driver pid 4242 on host another-host"):
        acquire(str(other), "s", clock=lambda: 5059.0, on_lost=never_lost)  # within its expiry
    lease, taken = acquire(str(other), "s", clock=lambda: 5061.0, on_lost=never_lost)
    assert taken == elsewhere(renewed=5000.0) and lease.generation == 8
    lease.release()


def test_renewal_and_a_lease_lost_to_another_driver(tmp_path):
    root = tmp_path / "sweep"
    now = [100.0]
    lease, _ = acquire(str(root), "s", expiry=1e6, clock=lambda: now[0], on_lost=never_lost)
    now[0] = 130.0
    assert lease.renew() and records(root)["00000001.json"]["renewed"] == 130.0
    # another driver found it stale (this one suspended past its expiry) and took it over
    successor = elsewhere(renewed=131.0)
    place(root, 2, successor)
    now[0] = 160.0
    assert not lease.renew()
    assert records(root)["00000001.json"]["renewed"] == 130.0  # not rewritten
    lease.release()
    assert records(root)["00000002.json"] == asdict(successor)  # not released by the loser


def test_the_renewing_thread_stops_the_driver_when_the_lease_is_lost(tmp_path):
    """The renewal thread (every quarter of the expiry) calls ``on_lost`` once it finds the
    lease taken over; the event only bounds how long the test waits for that."""
    root = tmp_path / "sweep"
    lost = threading.Event()
    lease, _ = acquire(str(root), "s", expiry=0.02, on_lost=lost.set)
    place(root, 2, elsewhere(renewed=0.0))
    assert lost.wait(60)
    lease.release()


def test_a_second_driver_of_a_held_sweep_exits_2_naming_the_holder(tmp_path, capsys):
    """Refused before Ray starts (and so before the plan is printed)."""
    spec = write_sweep(tmp_path, resources={"workers": 1, "cpus_per_worker": 0.5})
    root = tmp_path / "out" / "t"
    lease, _ = acquire(str(root), "s", on_lost=never_lost)
    try:
        code = sweep_cli.main([str(spec), "--storage", str(tmp_path / "out")])
    finally:
        lease.release()
    printed = capsys.readouterr()
    assert code == 2 and f"--storage: {root} is in use by another sweep driver: driver pid " \
        f"{os.getpid()} on host {socket.gethostname()}" in printed.err
    assert "sweep t:" not in printed.out and not (root / "sweep.json").exists()


def test_on_s3_the_lease_is_a_conditional_put(s3, tmp_path):
    """Against moto's S3 server: the create is refused when the record exists (a plain put
    would have replaced it), a live record is named, an expired one is taken over."""
    from raylf.sweep.lease import _store

    root = s3.uri(tmp_path.name, "t")
    lease, taken = acquire(root, "s", on_lost=never_lost)
    assert taken is None
    store = _store(root)
    assert store.generations() == [1]
    mine = store.read(1)
    assert not store.create(1, b"another driver's record")
    assert store.read(1) == mine
    with pytest.raises(LeaseHeld, match=f"{root} is in use by another sweep driver: driver pid "
                                        f"{os.getpid()}"):
        acquire(root, "s", on_lost=never_lost)
    lease.release()
    assert Holder.decode(store.read(1)).released

    other = s3.uri(tmp_path.name, "other")
    assert _store(other).create(5, json.dumps(asdict(elsewhere(renewed=0.0))).encode())
    lease, taken = acquire(other, "s", clock=lambda: 61.0, on_lost=never_lost)
    assert taken == elsewhere(renewed=0.0) and _store(other).generations() == [6]
    lease.release()


def test_on_another_filesystem_records_are_kept_the_same_way_but_not_atomically(tmp_path):
    """``gs://`` and the like, through pyarrow (here pointed at a local folder): the same
    records, a create that refuses an existing one, but no atomic create (the CLI says so)."""
    import pyarrow.fs as pafs

    from raylf.sweep.lease import _PyarrowStore

    store = _PyarrowStore(pafs.LocalFileSystem(), str(tmp_path / FOLDER))
    assert not store.atomic and store.generations() == [] and store.read(1) is None
    assert store.create(1, b"first") and not store.create(1, b"second")
    assert store.create(2, b"next")
    store.write(2, b"renewed")
    assert store.generations() == [1, 2] and store.read(1) == b"first"
    assert store.read(2) == b"renewed"
    store.delete(1)
    store.delete(1)
    assert store.generations() == [2]
