"""Where every expert lives on disk: file, absolute offset and size of each stacked expert tensor.

A stacked expert tensor is ``[.., .., n_expert]`` in ggml order, so expert ``e``'s slice is the
contiguous byte range ``offset + e * nbytes / n_expert`` of length ``nbytes / n_expert``.
Split GGUFs (``name-00001-of-00003.gguf``) are read shard by shard; each tensor records its shard.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import gguf

from bmoe.errors import ModelFileError
from bmoe.stream.archs import ArchEntry, NothingToStreamError, lookup

_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<idx>\d{5})-of-(?P<n>\d{5})\.gguf$")
_BLK_RE = re.compile(r"^blk\.(?P<il>\d+)\.(?P<suffix>.+)$")


class LayoutError(ModelFileError, ValueError):
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
    name: str  # full GGUF name, e.g. "blk.3.ffn_up_exps.weight"
    il: int  # layer index
    proj: str  # projection: the suffix without ".weight", e.g. "ffn_up_exps"
    file_index: int  # shard index into ModelLayout.files
    offset: int  # absolute byte offset of expert 0 in its shard
    nbytes: int  # bytes of the whole stacked tensor
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
    experts: tuple[ExpertTensor, ...]  # sorted by (il, proj)
    n_expert: int
    n_expert_used: int  # routed per token: the file's, or --n-expert-used's (with_n_expert_used)
    dense_nbytes: int  # every non-expert tensor: what a streamed load reads
    expert_nbytes: int  # every expert tensor, all layers
    # Tensors of the multi-token-prediction (NextN) blocks after the trunk, experts included, as
    # (file index, offset, nbytes): llama.cpp skips them unless it is asked to load them, and its
    # trunk never computes them, so they neither stream nor count as dense; the twin holes them.
    unloaded: tuple[tuple[int, int, int], ...] = ()
    # Resident tensors indexed by expert beside the streamed weights ("blk.<il>.ffn_*_exps.*": gpt-oss's
    # per-expert biases, gemma4's per-expert scales): the graph gathers them by the routed ids too.
    expert_side: tuple[str, ...] = ()

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

    def with_n_expert_used(self, k: int) -> "ModelLayout":
        """This layout with ``k`` experts routed per token instead of the file's
        ``<arch>.expert_used_count``: what llama.cpp routes when that key is overridden at load
        (``--n-expert-used``). The floor, the read-ahead's guess and its wide cut follow it."""
        if isinstance(k, bool) or not isinstance(k, int) or not 0 < k <= self.n_expert:
            raise ValueError(f"n_expert_used must be an integer in 1..{self.n_expert}, got {k!r}")
        return replace(self, n_expert_used=k)


def shard_paths(path: Path) -> tuple[Path, ...]:
    """All shards of a split GGUF given any one of them (or just ``path`` when not split)."""
    m = _SPLIT_RE.match(path.name)
    if not m:
        return (path,)
    n = int(m["n"])
    return tuple(path.with_name(f"{m['stem']}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1))


# GGUF value types (gguf.GGUFValueType) -> fixed size in bytes; STRING (8) and ARRAY (9) vary.
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_NESTING = 8  # arrays of arrays: GGUF writers nest one level at most
# Integer arrays up to this long are decoded (per-layer hparams such as a head count that differs
# from layer to layer: step35's attention.head_count); longer ones (a vocabulary's token types)
# are skipped by length like every other array.
_INT_TYPES = frozenset((0, 1, 2, 3, 4, 5, 10, 11))
_MAX_DECODED = 1024
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    offset: int  # absolute byte offset in the shard
    nbytes: int
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    ggml_type: int = 0  # gguf.GGMLQuantizationType value (0 = F32)


@dataclass(frozen=True, slots=True)
class GgufHeader:
    # scalar and string keys, and short integer arrays as tuples (other arrays are skipped)
    fields: dict[str, object]
    tensors: tuple[TensorInfo, ...]


class _Cursor:
    """Reads little-endian GGUF items from a mapping; every read is bounds-checked by struct."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def u32(self) -> int:
        v = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self) -> int:
        v = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def string(self) -> str:
        n = self.u64()
        if self.pos + n > len(self.buf):
            raise ValueError(f"string of {n} bytes runs past the end of the file")
        v = self.buf[self.pos : self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return v

    def value(self, vtype: int, depth: int = 0) -> object | None:
        """One value; arrays are skipped (None), but for integer arrays of at most ``_MAX_DECODED``
        values, which come back as a tuple. Arrays nest at most ``_MAX_NESTING`` deep (a damaged
        header must not exhaust the interpreter's stack)."""
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            if depth >= _MAX_NESTING:
                raise ValueError(f"arrays nested more than {_MAX_NESTING} deep at byte {self.pos}")
            etype, count = self.u32(), self.u64()
            if etype == _STRING:  # each element carries its own length: walk them
                for _ in range(count):
                    self.pos += 8 + _U64.unpack_from(self.buf, self.pos)[0]
            elif etype in _INT_TYPES and count <= _MAX_DECODED and depth == 0:
                efmt = _SCALAR_FMT[etype]
                v = struct.unpack_from(f"<{count}{efmt[1]}", self.buf, self.pos)
                self.pos += count * _SCALAR_SIZE[etype]
                return v
            elif etype in _SCALAR_SIZE:
                self.pos += count * _SCALAR_SIZE[etype]
            else:
                for _ in range(count):
                    self.value(etype, depth + 1)
            return None
        fmt = _SCALAR_FMT.get(vtype)
        if fmt is None:
            raise ValueError(f"unknown GGUF value type {vtype} at byte {self.pos}")
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += _SCALAR_SIZE[vtype]
        return v


def read_header(path: Path) -> GgufHeader:
    """Walk a GGUF's header: scalar metadata and tensor infos, skipping arrays by length.

    gguf.GGUFReader decodes every array too (a 49k-token vocabulary costs seconds in Python);
    this touches only the header pages. Raises ValueError on a malformed or truncated header
    (OSError when the file cannot be opened). It does not check that the tensors' data lies
    inside the file: read_layout does.
    """
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise ValueError("the file is empty (0 bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != b"GGUF":
                raise ValueError(f"not a GGUF file (bad magic {bytes(buf[:4])!r}, expected b'GGUF')")
            c = _Cursor(buf)
            c.pos = 4
            try:
                version = c.u32()
                if version not in (2, 3):
                    raise ValueError(f"GGUF version {version} is not supported")
                n_tensors, n_kv = c.u64(), c.u64()
                fields: dict[str, object] = {}
                for _ in range(n_kv):
                    key = c.string()
                    v = c.value(c.u32())
                    if v is not None:
                        fields[key] = v
                infos: list[tuple[str, tuple[int, ...], int, int]] = []
                for _ in range(n_tensors):
                    name = c.string()
                    ne = tuple(c.u64() for _ in range(c.u32()))
                    infos.append((name, ne, c.u32(), c.u64()))
            except (struct.error, IndexError, OverflowError):
                raise ValueError(
                    f"the header runs past the end of the file ({len(buf)} bytes): the file is truncated or damaged"
                ) from None
            align = fields.get("general.alignment", 32)
            if not isinstance(align, int) or isinstance(align, bool) or align <= 0:
                raise ValueError(f"general.alignment is {align!r}, not a positive integer")
            data_start = -(-c.pos // align) * align
    tensors = []
    for name, ne, ggml_type, rel in infos:
        try:
            block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
        except (KeyError, ValueError):
            raise ValueError(f"tensor {name} has unknown ggml type {ggml_type}") from None
        if block > 1 and (not ne or ne[0] % block):
            raise ValueError(
                f"tensor {name} has rows of {ne[0] if ne else 0} values, not a multiple of its type's block of {block}"
            )
        n = 1
        for d in ne:
            n *= d
        tensors.append(TensorInfo(name, data_start + rel, n // block * type_size, ne, ggml_type))
    return GgufHeader(fields, tuple(tensors))


# What reading a malformed or truncated GGUF can raise: each becomes a LayoutError naming the file.
_READ_ERRORS = (OSError, ValueError, struct.error, IndexError, KeyError, ArithmeticError, MemoryError)


def _read_shard(p: Path) -> tuple[FileId, GgufHeader]:
    """One shard's identity and header, with every tensor's data checked to lie inside the file.

    The bounds check comes first, before anything uses the layout: a dense twin written from a
    truncated file would copy past its end, and the streamer would read experts that are not there.
    """
    try:
        file_id = FileId.of(p)
        header = read_header(p)
    except _READ_ERRORS as exc:
        raise LayoutError(f"cannot read GGUF {p}: {exc}") from exc
    for t in header.tensors:
        end = t.offset + t.nbytes
        if end > file_id.size:
            raise LayoutError(
                f"GGUF {p} is truncated or damaged: tensor {t.name} needs bytes {t.offset}..{end} "
                f"but the file has {file_id.size} bytes"
            )
    return file_id, header


def read_layout(path: Path | str, entry: ArchEntry | None = None) -> ModelLayout:
    """Read tensor offsets of every shard. ``entry`` defaults to the registry's for the file's arch.

    Raises LayoutError (naming the shard) for missing, unreadable, malformed or truncated shards,
    before anything else is looked at; UnsupportedArchError for an arch without an
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
    trunk: int | None = None  # layers from here on are NextN blocks
    for idx, p in enumerate(paths):
        file_id, header = _read_shard(p)
        files.append(file_id)
        if idx == 0:
            arch_field = header.fields.get("general.architecture")
            if not isinstance(arch_field, str):
                raise LayoutError(f"{p} has no general.architecture")
            arch = arch_field
            used = header.fields.get(f"{arch}.expert_used_count")
            n_expert_used = int(used) if isinstance(used, int) else 0
            trunk = _trunk_layers(header.fields, arch)
        for t in header.tensors:
            tensors.append((idx, t.name, t.offset, t.nbytes, t.ne))
    assert arch is not None
    # Dense before arch: SmolLM2 (llama) must hear "nothing to stream", not "unsupported arch".
    if not any("_exps." in name for _, name, _, _, _ in tensors):
        raise NothingToStreamError(
            f"{paths[0]} ({arch}) has no expert tensors: it is a dense model and there is "
            "nothing to stream; run it without --moe-stream"
        )
    if entry is None:
        entry = lookup(arch)
    experts: list[ExpertTensor] = []
    unloaded: list[tuple[int, int, int]] = []
    dense = 0
    side: list[str] = []
    for idx, name, offset, nbytes, ne in tensors:
        m = _BLK_RE.match(name)
        if m and trunk is not None and int(m["il"]) >= trunk:
            unloaded.append((idx, offset, nbytes))
            continue
        if not (m and entry.streams(m["suffix"])):
            dense += nbytes
            if m and "_exps." in m["suffix"]:
                side.append(name)
            continue
        n_expert = ne[2] if len(ne) >= 3 else 0
        if n_expert <= 0 or nbytes <= 0 or nbytes % n_expert:
            raise LayoutError(f"{paths[idx]}: expert tensor {name} has shape {list(ne)}; expected [.., .., n_expert]")
        experts.append(
            ExpertTensor(
                name=name,
                il=int(m["il"]),
                proj=m["suffix"].removesuffix(".weight"),
                file_index=idx,
                offset=offset,
                nbytes=nbytes,
                n_expert=n_expert,
            )
        )
    if not experts:
        raise LayoutError(f"{paths[0]} names no tensor of {entry.expert_tensors} although it has experts")
    experts.sort(key=lambda t: (t.il, t.proj))
    n_experts = {t.n_expert for t in experts}
    if len(n_experts) != 1:
        raise LayoutError(f"{paths[0]}: expert tensors disagree on n_expert: {sorted(n_experts)}")
    n_expert = n_experts.pop()
    if not 0 < n_expert_used <= n_expert:
        raise LayoutError(f"{paths[0]}: {arch}.expert_used_count={n_expert_used} is not in 1..{n_expert}")
    return ModelLayout(
        arch=arch,
        files=tuple(files),
        experts=tuple(experts),
        n_expert=n_expert,
        n_expert_used=n_expert_used,
        dense_nbytes=dense,
        expert_nbytes=sum(t.nbytes for t in experts),
        unloaded=tuple(unloaded),
        expert_side=tuple(side),
    )


def _trunk_layers(fields: dict[str, object], arch: str) -> int | None:
    """How many layers llama.cpp's trunk computes when the GGUF names NextN blocks after them
    (``<arch>.nextn_predict_layers``: block_count - nextn, as llama_hparams::n_layer()), else None.
    (granite-switch reuses the key for a layer its trunk does compute; it is not in the registry.)"""
    n_block, n_nextn = fields.get(f"{arch}.block_count"), fields.get(f"{arch}.nextn_predict_layers")
    if not (isinstance(n_block, int) and isinstance(n_nextn, int)) or n_nextn <= 0:
        return None
    if n_nextn >= n_block:
        raise LayoutError(f"{arch}.nextn_predict_layers={n_nextn} leaves no trunk of the {n_block} layers")
    return n_block - n_nextn
