"""Where every expert lives on disk: file, absolute offset and size of each stacked expert tensor.

A stacked expert tensor is ``[.., .., n_expert]`` in ggml order, so expert ``e``'s slice is the
contiguous byte range ``offset + e * nbytes / n_expert`` of length ``nbytes / n_expert``.
Split GGUFs (``name-00001-of-00003.gguf``) are read shard by shard; each tensor records its shard.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import gguf

from .archs import ArchEntry, NothingToStreamError, lookup

_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<idx>\d{5})-of-(?P<n>\d{5})\.gguf$")
_BLK_RE = re.compile(r"^blk\.(?P<il>\d+)\.(?P<suffix>.+)$")


class LayoutError(ValueError):
    """The GGUF (or one of its shards) is missing, unreadable or inconsistent."""


@dataclass(frozen=True, slots=True)
class FileId:
    """What a shard looked like when the layout was read; a mismatch later means it changed."""
    path: Path
    size: int
    mtime_ns: int
    inode: int
    device: int

    @staticmethod
    def of(path: Path) -> "FileId":
        st = os.stat(path)
        return FileId(path=path, size=st.st_size, mtime_ns=st.st_mtime_ns, inode=st.st_ino, device=st.st_dev)


@dataclass(frozen=True, slots=True)
class ExpertTensor:
    name: str          # full GGUF name, e.g. "blk.3.ffn_up_exps.weight"
    il: int            # layer index
    proj: str          # projection: the suffix without ".weight", e.g. "ffn_up_exps"
    file_index: int    # shard index into ModelLayout.files
    offset: int        # absolute byte offset of expert 0 in its shard
    nbytes: int        # bytes of the whole stacked tensor
    n_expert: int

    @property
    def slice_nbytes(self) -> int:
        return self.nbytes // self.n_expert

    def slice_offset(self, expert: int) -> int:
        """Absolute file offset of ``expert``'s slice."""
        return self.offset + expert * self.slice_nbytes


@dataclass(frozen=True, slots=True)
class ModelLayout:
    arch: str
    files: tuple[FileId, ...]
    experts: tuple[ExpertTensor, ...]   # sorted by (il, proj)
    n_expert: int
    n_expert_used: int
    dense_nbytes: int                   # every non-expert tensor: what a streamed load reads
    expert_nbytes: int                  # every expert tensor, all layers

    @property
    def layers(self) -> tuple[int, ...]:
        """Layers that carry experts, ascending."""
        return tuple(sorted({t.il for t in self.experts}))

    @property
    def projections(self) -> tuple[str, ...]:
        return tuple(sorted({t.proj for t in self.experts}))

    def layer_tensors(self, il: int) -> tuple[ExpertTensor, ...]:
        return tuple(t for t in self.experts if t.il == il)

    def expert_nbytes_in_layer(self, il: int) -> int:
        """Bytes of one expert of layer ``il`` across its projections (what a miss reads)."""
        return sum(t.slice_nbytes for t in self.experts if t.il == il)

    def floor_bytes(self) -> int:
        """One token's routed working set: every MoE layer's n_expert_used experts."""
        return sum(self.n_expert_used * self.expert_nbytes_in_layer(il) for il in self.layers)

    def by_name(self) -> dict[str, ExpertTensor]:
        return {t.name: t for t in self.experts}


def shard_paths(path: Path) -> tuple[Path, ...]:
    """All shards of a split GGUF given any one of them (or just ``path`` when not split)."""
    m = _SPLIT_RE.match(path.name)
    if not m:
        return (path,)
    n = int(m["n"])
    return tuple(path.with_name(f"{m['stem']}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1))


def _field_int(reader: gguf.GGUFReader, key: str) -> int | None:
    field = reader.get_field(key)
    if field is None:
        return None
    return int(field.contents())


def _field_str(reader: gguf.GGUFReader, key: str) -> str | None:
    field = reader.get_field(key)
    return None if field is None else str(field.contents())


def read_layout(path: Path | str, entry: ArchEntry | None = None) -> ModelLayout:
    """Read tensor offsets of every shard. ``entry`` defaults to the registry's for the file's arch.

    Raises LayoutError for missing/unreadable shards, UnsupportedArchError for an arch without an
    entry, and NothingToStreamError for a model without expert tensors.
    """
    paths = shard_paths(Path(path))
    for p in paths:
        if not p.is_file():
            raise LayoutError(f"GGUF shard not found: {p}")
    files: list[FileId] = []
    tensors: list[tuple[int, str, int, int, tuple[int, ...]]] = []  # (shard, name, offset, nbytes, ne)
    arch = None
    n_expert_used = 0
    for idx, p in enumerate(paths):
        files.append(FileId.of(p))
        try:
            reader = gguf.GGUFReader(p, "r")
        except Exception as exc:  # gguf raises bare ValueError/struct errors on bad files
            raise LayoutError(f"cannot read GGUF {p}: {exc}") from exc
        if idx == 0:
            arch = _field_str(reader, "general.architecture")
            if arch is None:
                raise LayoutError(f"{p} has no general.architecture")
            n_expert_used = _field_int(reader, f"{arch}.expert_used_count") or 0
        for t in reader.tensors:
            tensors.append((idx, t.name, int(t.data_offset), int(t.n_bytes), tuple(int(d) for d in t.shape)))
        del reader  # drops its np.memmap of the shard
    assert arch is not None
    # Dense before arch: SmolLM2 (llama) must hear "nothing to stream", not "unsupported arch".
    if not any("_exps." in name for _, name, _, _, _ in tensors):
        raise NothingToStreamError(
            f"{paths[0].name} ({arch}) has no expert tensors: it is a dense model and there is "
            "nothing to stream; run it without --moe-stream"
        )
    if entry is None:
        entry = lookup(arch)
    experts: list[ExpertTensor] = []
    dense = 0
    for idx, name, offset, nbytes, ne in tensors:
        m = _BLK_RE.match(name)
        if not (m and entry.streams(m["suffix"])):
            dense += nbytes
            continue
        n_expert = ne[2] if len(ne) >= 3 else 0
        if n_expert <= 0 or nbytes % n_expert:
            raise LayoutError(f"expert tensor {name} has shape {list(ne)}; expected [.., .., n_expert]")
        experts.append(ExpertTensor(
            name=name, il=int(m["il"]), proj=m["suffix"].removesuffix(".weight"),
            file_index=idx, offset=offset, nbytes=nbytes, n_expert=n_expert,
        ))
    if not experts:
        raise LayoutError(f"{paths[0].name} names no tensor of {entry.expert_tensors} although it has experts")
    experts.sort(key=lambda t: (t.il, t.proj))
    n_experts = {t.n_expert for t in experts}
    if len(n_experts) != 1:
        raise LayoutError(f"expert tensors disagree on n_expert: {sorted(n_experts)}")
    n_expert = n_experts.pop()
    if not 0 < n_expert_used <= n_expert:
        raise LayoutError(f"{arch}.expert_used_count={n_expert_used} is not in 1..{n_expert}")
    return ModelLayout(
        arch=arch, files=tuple(files), experts=tuple(experts), n_expert=n_expert,
        n_expert_used=n_expert_used, dense_nbytes=dense,
        expert_nbytes=sum(t.nbytes for t in experts),
    )
