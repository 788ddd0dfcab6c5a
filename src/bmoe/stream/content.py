"""A cheap content check of a GGUF: a sampled hash of every region of every shard.

Size, mtime and inode (``FileId``) miss an in-place overwrite that keeps all three (``rsync
--inplace`` of another file of the same size, a ``dd conv=notrunc``, a tool that restores the
mtime). Hashing whole files would read gigabytes, so the check samples: every region of a shard
(each stacked expert tensor, and each range of dense bytes between them) gives ``PER_REGION``
blocks of ``BLOCK`` bytes at pseudo-random offsets that depend only on the region (the same in
every process), and each shard's blocks are hashed together. An overwrite of a whole tensor or
more always changes the hash; a smaller one only if it touches a sampled block.

Where it is used: the dense twin records the sample of the file it was made from (and is rewritten
when the file's sample differs at the next open), and ``ExpertReader`` checks it again on a
schedule while it streams (``CHECK_EVERY_S``). The blocks are read through the page cache with
readahead off, so a check costs a few hundred small reads the first time and memory copies after.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from bmoe.stream.layout import ModelLayout

BLOCK = 4096  # bytes per sampled block (one page when the region allows an aligned one)
PER_REGION = 2  # blocks per region
CHECK_EVERY_S = 1.0  # a streaming session re-checks at most this often ...
COST_SHARE = 0.005  # ... and never more than this share of the time (interval >= cost / share)
SCHEME = f"blake2b-16/{BLOCK}x{PER_REGION}"  # what a recorded sample was taken with


def expert_ranges(layout: ModelLayout, file_index: int) -> list[tuple[int, int]]:
    """The shard's byte ranges the twin leaves as holes, adjacent ones merged: its expert tensors
    and the tensors llama.cpp does not load (``ModelLayout.unloaded``, NextN blocks)."""
    ranges = sorted(
        [(t.offset, t.offset + t.nbytes) for t in layout.experts if t.file_index == file_index]
        + [(off, off + n) for fi, off, n in layout.unloaded if fi == file_index]
    )
    merged: list[tuple[int, int]] = []
    for a, b in ranges:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def dense_ranges(layout: ModelLayout, file_index: int) -> list[tuple[int, int]]:
    """The complement of the expert ranges in [0, size): header, dense tensors, padding."""
    out, pos = [], 0
    for a, b in expert_ranges(layout, file_index):
        if a > pos:
            out.append((pos, a))
        pos = max(pos, b)
    size = layout.files[file_index].size
    if pos < size:
        out.append((pos, size))
    return out


def _regions(layout: ModelLayout, file_index: int) -> list[tuple[int, int]]:
    experts = [(t.offset, t.offset + t.nbytes) for t in layout.experts if t.file_index == file_index]
    return sorted(experts + dense_ranges(layout, file_index))


def _blocks(file_index: int, a: int, b: int) -> list[tuple[int, int]]:
    """``PER_REGION`` blocks of region [a, b), at offsets fixed by the region alone."""
    if b - a <= BLOCK:
        return [(a, b - a)] if b > a else []
    out = set()
    for i in range(PER_REGION):
        seed = hashlib.blake2b(f"{file_index}:{a}:{b}:{i}".encode(), digest_size=8).digest()
        off = a + int.from_bytes(seed, "little") % (b - a - BLOCK + 1)
        aligned = off - off % BLOCK  # one page, not two, where the region allows it
        out.add((aligned if aligned >= a else off, BLOCK))
    return sorted(out)


@dataclass(frozen=True, slots=True)
class ContentSample:
    """Which blocks of each shard were sampled, and their hash (per shard, hex)."""

    blocks: tuple[tuple[tuple[int, int], ...], ...]  # per shard: (offset, nbytes), ascending
    digests: tuple[str, ...]

    @staticmethod
    def take(layout: ModelLayout) -> "ContentSample":
        """Sample every shard of ``layout`` now. Raises OSError if a shard cannot be read."""
        blocks = tuple(
            tuple(sorted({blk for a, b in _regions(layout, i) for blk in _blocks(i, a, b)}))
            for i in range(len(layout.files))
        )
        return ContentSample(blocks, digests([f.path for f in layout.files], blocks))

    @property
    def n_blocks(self) -> int:
        return sum(len(b) for b in self.blocks)

    def changed(self, paths: Sequence[Path]) -> int | None:
        """Index of the first shard whose sample differs now, or None. Raises OSError."""
        now = digests(paths, self.blocks)
        return next((i for i, (a, b) in enumerate(zip(self.digests, now)) if a != b), None)

    def to_json(self) -> dict[str, object]:
        return {"scheme": SCHEME, "digests": list(self.digests)}

    def matches_json(self, recorded: object) -> bool:
        """Whether ``recorded`` (a ``to_json``) is this sample: same scheme, same hashes."""
        return recorded == self.to_json()


def digests(paths: Sequence[Path], blocks: Sequence[Sequence[tuple[int, int]]]) -> tuple[str, ...]:
    """Each shard's hash of its ``blocks``. Raises OSError naming the shard (``filename``) that failed."""
    out = []
    for path, blks in zip(paths, blocks):
        h = hashlib.blake2b(digest_size=16)
        fd = os.open(path, os.O_RDONLY)
        try:
            # Random reads: without this the kernel's readahead would read 128 KiB around each block.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            for off, n in blks:
                data = os.pread(fd, n, off)
                h.update(off.to_bytes(8, "little"))
                h.update(data)  # a short read (a truncated file) hashes differently: a change
        except OSError as exc:
            if exc.filename is None:  # a pread on an fd names no file: callers report this one
                exc.filename = str(path)
            raise
        finally:
            os.close(fd)
        out.append(h.hexdigest())
    return tuple(out)
