"""Damage in the SQLite write-ahead log that SQLite itself would pass over in silence.

After a crash (kill -9, an OOM kill) the turns committed since the last checkpoint live
only in ``<db>-wal``. SQLite reads that file up to its first frame whose checksum fails and
ignores the rest; it ignores the whole file when its header is damaged, and a database
file emptied under it. A crash can only leave a torn *last* transaction (never
acknowledged), so anything more is damage (a torn or corrupted write, a file truncated or
replaced by hand): opening the database then drops acknowledged turns without a word, and
the next checkpoint overwrites what could have been recovered. :func:`wal_damage` finds
the cases a crash cannot produce, before SQLite opens the file:

- a header that is not a WAL header (or fails its checksum) over a file holding frames;
- a frame of the current generation (its salts) that fails the checksum chain, followed by
  a commit frame of the same generation: SQLite would drop that committed transaction (a
  crash between writing a frame's header and its page leaves a failing frame too, but
  always the last one of its generation);
- a database file without its header (empty) while the WAL holds committed frames.

A WAL cut short at a frame boundary cannot be told from a crash before those commits.
The format: https://www.sqlite.org/fileformat.html#the_write_ahead_log
"""

from __future__ import annotations

import struct
import sys
from array import array
from pathlib import Path
from typing import BinaryIO

_HEADER = 32
_FRAME_HEADER = 24
_MAGIC = {0x377F0682: False, 0x377F0683: True}  # -> checksums over big-endian words
_VERSION = 3007000
_DB_HEADER = 100
_MASK = 0xFFFFFFFF


def _checksum(data: bytes, big: bool, s0: int, s1: int) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (a multiple of 8 bytes), continuing ``s0, s1``."""
    words = array("I")
    words.frombytes(data)
    if big != (sys.byteorder == "big"):
        words.byteswap()
    it = iter(words)
    for a, b in zip(it, it, strict=True):
        s0 = (s0 + a + s1) & _MASK
        s1 = (s1 + b + s0) & _MASK
    return s0, s1


def wal_damage(db: Path) -> str | None:
    """One line saying how ``db``'s WAL is damaged so that SQLite would drop committed
    transactions, or None (no WAL, or nothing a crash could not have left)."""
    wal = Path(f"{db}-wal")
    try:
        f = wal.open("rb")
    except FileNotFoundError:
        return None
    with f:
        size = wal.stat().st_size
        if size < _HEADER:
            return None
        header = f.read(_HEADER)
        magic, version, page, _, salt1, salt2, c1, c2 = struct.unpack(">8I", header)
        big = _MAGIC.get(magic)
        valid = (
            big is not None
            and version == _VERSION
            and 512 <= page <= 65536
            and page & (page - 1) == 0
            and _checksum(header[:24], big, 0, 0) == (c1, c2)
        )
        if not valid:
            if size < _HEADER + _FRAME_HEADER + 512:
                return None  # no frame at all: nothing to lose
            return f"{wal} has a damaged header: SQLite would ignore every frame it holds"
        assert big is not None
        frames = (size - _HEADER) // (_FRAME_HEADER + page)
        broken, commits = _scan(f, frames, page, big, (salt1, salt2), (c1, c2))
    if broken is not None and commits:
        return (
            f"{wal} is damaged at frame {broken + 1}: SQLite would drop the {commits} "
            "committed transaction(s) after it"
        )
    if broken is None and commits and _db_header_missing(db):
        return f"{db} has no database header but {wal} holds {commits} committed transaction(s)"
    return None


def _scan(
    f: BinaryIO, frames: int, page: int, big: bool, salts: tuple[int, int], sums: tuple[int, int]
) -> tuple[int | None, int]:
    """Walk the current generation's frames: (the first failing frame, or None; the commit
    frames SQLite would drop after it, or, with none failing, the commit frames it keeps)."""
    broken: int | None = None
    commits = 0
    for i in range(frames):
        # One read per frame: a writer (a proxy running beside a reader) writes a frame's
        # header before its page, so a frame read whole is never an old header on a new page.
        frame = f.read(_FRAME_HEADER + page)
        head, data = frame[:_FRAME_HEADER], frame[_FRAME_HEADER:]
        _, commit, s1, s2, f1, f2 = struct.unpack(">6I", head)
        if (s1, s2) != salts:
            break  # an older generation's frames from here on: never read
        if broken is None:
            sums = _checksum(head[:8] + data, big, *sums)
            if sums != (f1, f2):
                broken, commits = i, 0
                continue
        if commit:
            commits += 1
    if broken is not None and commits == 0:
        return None, 0  # a torn last transaction: what a crash leaves
    return broken, commits


def _db_header_missing(db: Path) -> bool:
    try:
        return db.stat().st_size < _DB_HEADER
    except FileNotFoundError:
        return True
