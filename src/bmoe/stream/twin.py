"""A dense twin of a GGUF: the same file with every expert byte range left as a hole.

Why: with load_mode MMAP, llama.cpp 0.3.36 maps each shard with MAP_POPULATE (llama-mmap.cpp),
which reads the *whole* file before the first token; lazy_mode does not help for MoE archs
because it only skips ranges of tensors the arch marks TENSOR_READ_LAZY (gemma4's per-layer
embeddings), never expert tensors. Loading the twin instead, MAP_POPULATE faults the holes in
as zero pages without touching the disk, so opening reads the dense weights only. The expert
tensors' ``->data`` are rebound onto bmoe's buffers before they are ever computed, and the
streamer reads the experts from the original GGUF, so the zeros are never used.

The twin costs disk space equal to the dense bytes (sparse file), is written once per source
file (keyed by its size, mtime and inode) and replaced atomically.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from .layout import FileId, ModelLayout
from bmoe.errors import BmoeError

_CHUNK = 8 << 20


class TwinError(BmoeError, OSError):
    """The dense twin could not be written (disk full, no sparse files, ...)."""


def _expert_ranges(layout: ModelLayout, file_index: int) -> list[tuple[int, int]]:
    ranges = sorted((t.offset, t.offset + t.nbytes) for t in layout.experts if t.file_index == file_index)
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
    for a, b in _expert_ranges(layout, file_index):
        if a > pos:
            out.append((pos, a))
        pos = max(pos, b)
    size = layout.files[file_index].size
    if pos < size:
        out.append((pos, size))
    return out


def _stamp(f: FileId) -> str:
    return json.dumps({"size": f.size, "mtime_ns": f.mtime_ns, "inode": f.inode, "device": f.device})


def _copy(src: int, dst: int, a: int, b: int) -> None:
    off = a
    while off < b:
        n = min(_CHUNK, b - off)
        try:
            done = os.copy_file_range(src, dst, n, off, off)
        except OSError:  # cross-device or unsupported: plain copy
            data = os.pread(src, n, off)
            done = os.pwrite(dst, data, off) if data else 0
        if done <= 0:
            raise TwinError(f"copying bytes {off}..{b} into the dense twin made no progress")
        off += done


def twin_dir(layout: ModelLayout, cache_dir: Path) -> Path:
    key = hashlib.sha256("\n".join(_stamp(f) + str(f.path.resolve()) for f in layout.files).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"{layout.files[0].path.stem}-{key}"


def dense_twin(layout: ModelLayout, cache_dir: Path) -> Path:
    """Path of the first shard of the dense twin (written now if missing or stale)."""
    out = twin_dir(layout, cache_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TwinError(f"cannot make the dense twin's folder {out}: {exc.strerror or exc}") from exc
    for idx, f in enumerate(layout.files):
        dst = out / f.path.name
        stamp = out / (f.path.name + ".source.json")
        if dst.is_file() and stamp.is_file() and stamp.read_text() == _stamp(f) and dst.stat().st_size == f.size:
            continue
        tmp = dst.with_suffix(".tmp")
        try:
            src_fd = os.open(f.path, os.O_RDONLY)
            try:
                dst_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.ftruncate(dst_fd, f.size)  # all holes; only the dense ranges get blocks
                    for a, b in dense_ranges(layout, idx):
                        _copy(src_fd, dst_fd, a, b)
                    os.fsync(dst_fd)
                finally:
                    os.close(dst_fd)
            finally:
                os.close(src_fd)
            os.replace(tmp, dst)
            stamp.write_text(_stamp(f))
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            if isinstance(exc, TwinError):
                raise
            raise TwinError(f"cannot write the dense twin of {f.path} in {out}: {exc}") from exc
    return out / layout.files[0].path.name


def allocated_bytes(path: Path) -> int:
    """Bytes the filesystem really holds for ``path`` (a sparse twin: about the dense bytes)."""
    return os.stat(path).st_blocks * 512
