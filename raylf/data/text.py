"""LEAF-style Shakespeare: split the Gutenberg complete works into speaking roles, then cut each
role's dialogue into next-character samples.

Parsing follows LEAF's reading of the 1994 plain text: a work starts at the line before "by
William Shakespeare"; a speech is a line ``  NAME. text`` (two-space indent) continued by lines
with a four-space indent; any other line ends it. One play (The Comedy of Errors) is printed
without indentation, so a work with no indented speech is read with unindented patterns. The
sonnets and "A Lover's Complaint" are poems, not dialogue, and are skipped. A role's lines are
joined with spaces and runs of spaces collapsed, as LEAF does before windowing.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

_AUTHOR = re.compile(r"^\s*by William Shakespeare\s*$", re.IGNORECASE)
_INDENTED = (re.compile(r"^  ([A-Za-z][A-Za-z ]*)\. (.*)"), re.compile(r"^    (.*\S.*)"))
_FLUSH = (re.compile(r"^([A-Za-z][A-Za-z ]*)\. (.*)"), re.compile(r"^(\S.*)"))
_POEMS = ("SONNETS", "LOVER'S COMPLAINT")


def parse_roles(text: str) -> dict[tuple[str, str], str]:
    """(work title, role) -> that role's whole dialogue, in order of appearance."""
    lines = text.splitlines()
    starts = []
    for i, line in enumerate(lines):
        if _AUTHOR.match(line):
            title = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            starts.append((i, title))
    roles: dict[tuple[str, str], list[str]] = defaultdict(list)
    for (begin, title), (end, _) in zip(starts, [*starts[1:], (len(lines), "")]):
        if any(p in title.upper() for p in _POEMS):
            continue
        body = lines[begin + 1:end]
        speech, cont = _INDENTED if any(map(_INDENTED[0].match, body)) else _FLUSH
        role = None
        for line in body:
            if m := speech.match(line):
                role = m.group(1).strip()
                roles[(title, role)].append(m.group(2))
            elif role is not None and (m := cont.match(line)):
                roles[(title, role)].append(m.group(1))
            else:
                role = None
    return {key: re.sub(" +", " ", " ".join(parts)).strip() for key, parts in roles.items()}


class Windows:
    """Read-only N×L array of character windows, materialized only for the rows indexed.

    Windows overlap (row i+1 is row i shifted by one character), so storing them would cost L
    times the text; this keeps the text once and copies rows out on ``windows[idx]``.
    """

    def __init__(self, ids: np.ndarray, starts: np.ndarray, length: int):
        self.ids, self.starts, self.length = ids, starts, length
        self.shape = (len(starts), length)
        self.dtype = np.dtype(np.int64)
        self.ndim = 2

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, idx) -> np.ndarray:
        return sliding_window_view(self.ids, self.length)[self.starts[idx]].astype(np.int64)


@dataclass(frozen=True)
class Corpus:
    windows: Windows
    targets: np.ndarray
    owners: np.ndarray

    @classmethod
    def build(cls, texts: list[str], vocab: list[str], seq_len: int) -> Corpus:
        """Encode every text (characters outside ``vocab`` become a space) and cut each into
        windows of ``seq_len`` characters labelled with the next one; a window never crosses
        from one text into the next. ``owners`` is the index of each window's text."""
        lut = np.full(256, vocab.index(" "), dtype=np.uint8)
        for i, ch in enumerate(vocab):
            lut[ord(ch)] = i
        encoded = [lut[np.minimum(np.frombuffer(t.encode("utf-32-le"), np.uint32), 255)]
                   for t in texts]
        ids = np.concatenate(encoded) if encoded else np.zeros(0, np.uint8)
        offsets = np.concatenate([[0], np.cumsum([len(e) for e in encoded])])
        counts = np.maximum(np.diff(offsets) - seq_len, 0)
        owners = np.repeat(np.arange(len(texts)), counts)
        starts = np.concatenate([np.arange(o, o + c) for o, c in zip(offsets, counts)]
                                or [np.zeros(0, np.int64)]).astype(np.int64)
        targets = ids[starts + seq_len].astype(np.int64)
        return cls(Windows(ids, starts, seq_len), targets, owners.astype(np.int64))
