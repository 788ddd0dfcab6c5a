"""The flash tier: one file per kept state in a folder of its model identity, within a byte budget.

A file is a fixed header, the tokens and the payload (the backend's state bytes):

    magic b"BMOEST01" | identity sha256 (32) | checksum sha256 (32) | n_tokens u64 | payload bytes u64
    tokens (n_tokens little-endian int64) | payload

The checksum is sha256 over the tokens and the payload. A file is written under a temporary name
(starting with a dot, never indexed) and renamed into place, which is atomic: a process sharing
the folder sees a whole file or none. Every read checks magic, identity, sizes, tokens and
checksum; a file that fails (edited, truncated, replaced, of another model) is deleted and counted,
and the caller recomputes the state. Writes that fail (disk full, folder gone) turn the tier off:
the store goes on in RAM only, and ``disabled`` says why.

The index is the files' headers, read again when the folder's modification time shows that
another process changed it (a change within the same clock tick as one of this process's own may
go unseen until the next: a missed hit, never a wrong state).

Eviction is LRU: a file's modification time is its last use (a read touches it), so the order
survives a restart and is shared by processes using the folder.
"""

from __future__ import annotations

import hashlib
import os
import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bmoe.state_store.keys import state_name, tokens_bytes
from bmoe.state_store.trie import TokenTrie

MAGIC = b"BMOEST01"
_HEAD = struct.Struct("<8s32s32sQQ")
SUFFIX = ".state"


@dataclass(slots=True)
class DiskEntry:
    name: str
    nbytes: int  # the whole file
    used: int  # mtime_ns: last use


def _header(identity: bytes, tokens: Sequence[int], payload: memoryview) -> tuple[bytes, bytes]:
    toks = tokens_bytes(tokens)
    digest = hashlib.sha256(toks)
    digest.update(payload)
    return _HEAD.pack(MAGIC, identity, digest.digest(), len(tokens), payload.nbytes), toks


class DiskTier:
    """States on flash under ``folder`` (the identity's own subfolder), at most ``budget`` bytes."""

    def __init__(self, folder: Path, identity: bytes, budget: int, warn: Callable[[str], None] | None = None) -> None:
        self.folder, self.identity, self.budget = Path(folder), identity, budget
        self._warn = warn  # told once, when a failed write turns the tier off
        self.index: TokenTrie[DiskEntry] = TokenTrie()
        self.bytes_held = 0
        self.corrupt = 0  # files found bad and deleted
        self.evictions = 0
        self.disabled = ""  # why the tier is off ("" while on)
        self._seen_mtime = -1
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            probe = self.folder / f".probe.{os.getpid()}.{uuid.uuid4().hex}.tmp"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            self.disabled = f"the store folder {self.folder} is not writable ({exc.strerror or exc})"
            return
        self.rescan()

    @property
    def on(self) -> bool:
        return not self.disabled

    # --- index ------------------------------------------------------------------------
    def _mtime(self) -> int:
        try:
            return self.folder.stat().st_mtime_ns
        except OSError:
            return -1

    def _changed_by_us(self, before: int) -> None:
        """This process changed the folder, and the index says so already: unless someone else
        changed it since the last scan (``before`` differs), the next lookup need not scan again."""
        if before == self._seen_mtime:
            self._seen_mtime = self._mtime()

    def rescan(self) -> None:
        """Index the folder's files by their headers, when it changed since the last scan (files
        written or deleted by this process or another one sharing it)."""
        mtime = self._mtime()
        if mtime < 0 or mtime == self._seen_mtime:
            return
        self._seen_mtime = mtime
        index: TokenTrie[DiskEntry] = TokenTrie()
        held = 0
        for path in self.folder.glob("*" + SUFFIX):
            read = self._read_head(path)
            if read is None:
                continue
            tokens, entry = read
            index.put(tokens, entry)
            held += entry.nbytes
        self.index, self.bytes_held = index, held

    def _read_head(self, path: Path) -> tuple[tuple[int, ...], DiskEntry] | None:
        try:
            with path.open("rb") as f:
                head = f.read(_HEAD.size)
                if len(head) != _HEAD.size:
                    return None
                magic, ident, _, n_tokens, n_payload = _HEAD.unpack(head)
                if magic != MAGIC or ident != self.identity:
                    return None
                toks = f.read(8 * n_tokens)
                st = os.fstat(f.fileno())
        except OSError:
            return None
        if len(toks) != 8 * n_tokens:
            return None
        tokens = tuple(int(t) for t in np.frombuffer(toks, dtype="<i8"))
        return tokens, DiskEntry(name=path.name, nbytes=st.st_size, used=st.st_mtime_ns)

    # --- states -----------------------------------------------------------------------
    def put(self, tokens: Sequence[int], payload: np.ndarray | bytes) -> bool:
        """Write the state; False when it was not (too big for the budget, or the tier is off; a
        write error turns it off)."""
        if not self.on:
            return False
        view = memoryview(payload if isinstance(payload, bytes) else payload.data).cast("B")
        head, toks = _header(self.identity, tokens, view)
        size = len(head) + len(toks) + view.nbytes
        if size > self.budget:
            return False
        self._evict_for(size)
        name = state_name(self.identity, tokens)
        before = self._mtime()
        tmp = self.folder / f".{name}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        try:
            with tmp.open("wb") as f:
                f.write(head)
                f.write(toks)
                f.write(view)
            os.replace(tmp, self.folder / name)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            self.disabled = f"writing a state to {self.folder} failed ({exc.strerror or exc})"
            if self._warn is not None:
                self._warn(self.disabled)
            return False
        old = self.index.get(tokens)
        self.bytes_held += size - (old.nbytes if old else 0)
        self.index.put(tuple(tokens), DiskEntry(name=name, nbytes=size, used=_now_ns(self.folder / name)))
        self._changed_by_us(before)
        return True

    def get(self, tokens: Sequence[int]) -> np.ndarray | None:
        """The payload of the state kept for exactly ``tokens``, checked; None (and the file gone)
        when it is missing or fails a check."""
        entry = self.index.get(tokens)
        if entry is None:
            return None
        path = self.folder / entry.name
        try:
            data = path.read_bytes()
        except OSError:
            self._forget(tokens, entry)
            return None
        payload = self._check(data, tokens)
        if payload is None:
            self.corrupt += 1
            path.unlink(missing_ok=True)
            self._forget(tokens, entry)
            return None
        try:
            os.utime(path)
            entry.used = path.stat().st_mtime_ns
        except OSError:
            pass
        return payload

    def _check(self, data: bytes, tokens: Sequence[int]) -> np.ndarray | None:
        if len(data) < _HEAD.size:
            return None
        magic, ident, digest, n_tokens, n_payload = _HEAD.unpack_from(data)
        toks = tokens_bytes(tokens)
        if magic != MAGIC or ident != self.identity or n_tokens != len(tokens):
            return None
        if len(data) != _HEAD.size + len(toks) + n_payload or data[_HEAD.size : _HEAD.size + len(toks)] != toks:
            return None
        body = memoryview(data)[_HEAD.size :]
        if hashlib.sha256(body).digest() != digest:
            return None
        return np.frombuffer(data, dtype=np.uint8, offset=_HEAD.size + len(toks))

    def remove(self, tokens: Sequence[int]) -> None:
        entry = self.index.get(tokens)
        if entry is not None:
            (self.folder / entry.name).unlink(missing_ok=True)
            self._forget(tokens, entry)

    def _forget(self, tokens: Sequence[int], entry: DiskEntry) -> None:
        self.index.remove(tokens)
        self.bytes_held -= entry.nbytes

    def _evict_for(self, size: int) -> None:
        """Delete the least recently used files until ``size`` more bytes fit the budget."""
        if self.bytes_held + size <= self.budget:
            return
        before = self._mtime()
        for tokens, entry in sorted(self.index.items(), key=lambda kv: kv[1].used):
            if self.bytes_held + size <= self.budget:
                break
            (self.folder / entry.name).unlink(missing_ok=True)
            self._forget(tokens, entry)
            self.evictions += 1
        self._changed_by_us(before)


def _now_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0
