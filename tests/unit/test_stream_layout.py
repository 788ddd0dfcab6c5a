"""Layout: every expert slice's file offset is checked against the bytes that were written."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from bmoe.stream import NothingToStreamError, UnsupportedArchError, format_archs, list_archs, lookup, read_layout
from bmoe.stream.layout import LayoutError, shard_paths

N_EXPERT, N_EMBD, N_FF = 6, 40, 24


def _write(path: Path, arch: str, tensors: dict[str, np.ndarray], extra: dict[str, int] | None = None) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.expert_used_count", 2)
    for k, v in (extra or {}).items():
        w.add_uint32(k, v)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _moe_tensors(rng: np.random.Generator, layers: range) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for il in layers:
        out[f"blk.{il}.attn_norm.weight"] = rng.standard_normal(N_EMBD).astype(np.float32)
        # numpy shape is ggml's reversed: [n_expert, n_ff, n_embd] = ggml {n_embd, n_ff, n_expert}
        out[f"blk.{il}.ffn_gate_exps.weight"] = rng.standard_normal((N_EXPERT, N_FF, N_EMBD)).astype(np.float32)
        out[f"blk.{il}.ffn_up_exps.weight"] = rng.standard_normal((N_EXPERT, N_FF, N_EMBD)).astype(np.float32)
        out[f"blk.{il}.ffn_down_exps.weight"] = rng.standard_normal((N_EXPERT, N_EMBD, N_FF)).astype(np.float32)
        out[f"blk.{il}.ffn_gate_exps.bias"] = rng.standard_normal((N_EXPERT, N_FF)).astype(np.float32)
    return out


def _check_slices(path_of: dict[int, Path], layout, tensors: dict[str, np.ndarray]) -> None:
    for t in layout.experts:
        raw = path_of[t.file_index].read_bytes()
        arr = tensors[t.name]
        for e in range(t.n_expert):
            got = raw[t.slice_offset(e) : t.slice_offset(e) + t.slice_nbytes]
            assert got == arr[e].tobytes(), (t.name, e)


def test_offsets_and_sizes_match_the_written_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    tensors = {"token_embd.weight": rng.standard_normal((10, N_EMBD)).astype(np.float32), **_moe_tensors(rng, range(3))}
    path = _write(tmp_path / "m.gguf", "olmoe", tensors)
    layout = read_layout(path)
    assert layout.arch == "olmoe" and layout.n_expert == N_EXPERT and layout.n_expert_used == 2
    assert layout.layers == (0, 1, 2)
    assert layout.projections == ("ffn_down_exps", "ffn_gate_exps", "ffn_up_exps")
    assert len(layout.experts) == 9  # .bias tensors (gpt-oss has them) are not streamed names: dense
    per_expert = 3 * N_EMBD * N_FF * 4
    assert layout.expert_nbytes_in_layer(1) == per_expert
    assert layout.floor_bytes() == 3 * 2 * per_expert
    expert_total = 9 * N_EXPERT * N_EMBD * N_FF * 4
    assert layout.expert_nbytes == expert_total
    assert layout.dense_nbytes == sum(a.nbytes for a in tensors.values()) - expert_total
    _check_slices({0: path}, layout, tensors)
    assert layout.files[0].size == path.stat().st_size


def test_nextn_blocks_after_the_trunk_neither_stream_nor_count_as_dense(tmp_path: Path) -> None:
    """A GLM-4.5-style GGUF: block_count 4 of which the last is a NextN (MTP) block with experts.
    llama.cpp's trunk computes layers 0..2 only and skips loading blk.3, so the layout streams
    layers 0..2, counts blk.3 as neither dense nor expert bytes, and the twin holes it."""
    from bmoe.stream.content import dense_ranges

    rng = np.random.default_rng(3)
    tensors = {
        "token_embd.weight": rng.standard_normal((10, N_EMBD)).astype(np.float32),
        **_moe_tensors(rng, range(4)),
        "blk.3.nextn.eh_proj.weight": rng.standard_normal((N_EMBD, 2 * N_EMBD)).astype(np.float32),
    }
    path = _write(
        tmp_path / "m.gguf", "glm4moe", tensors, {"glm4moe.block_count": 4, "glm4moe.nextn_predict_layers": 1}
    )
    layout = read_layout(path)
    assert layout.layers == (0, 1, 2)
    nextn = {n: a for n, a in tensors.items() if n.startswith("blk.3.")}
    assert len(layout.unloaded) == len(nextn) == 6
    assert sum(n for _, _, n in layout.unloaded) == sum(a.nbytes for a in nextn.values())
    assert layout.dense_nbytes == sum(
        a.nbytes for n, a in tensors.items() if not n.startswith("blk.3.") and "_exps.weight" not in n
    )
    kept = dense_ranges(layout, 0)
    for _, off, n in layout.unloaded:
        assert not any(a < off + n and off < b for a, b in kept)
    # Without the key every layer is the trunk's.
    assert read_layout(_write(tmp_path / "all.gguf", "glm4moe", tensors, {"glm4moe.block_count": 4})).layers == (
        0,
        1,
        2,
        3,
    )
    bad = _write(
        tmp_path / "bad.gguf", "glm4moe", tensors, {"glm4moe.block_count": 4, "glm4moe.nextn_predict_layers": 4}
    )
    with pytest.raises(LayoutError, match="nextn_predict_layers=4 leaves no trunk"):
        read_layout(bad)


def test_split_gguf_streams_from_its_shards(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    first = _moe_tensors(rng, range(0, 2))
    second = _moe_tensors(rng, range(2, 4))
    p1 = _write(tmp_path / "m-00001-of-00002.gguf", "qwen3moe", first, {"split.count": 2})
    p2 = _write(tmp_path / "m-00002-of-00002.gguf", "qwen3moe", second, {"split.count": 2})
    assert shard_paths(p2) == (p1, p2)
    layout = read_layout(p1)
    assert [f.path for f in layout.files] == [p1, p2]
    assert {t.file_index for t in layout.experts if t.il < 2} == {0}
    assert {t.file_index for t in layout.experts if t.il >= 2} == {1}
    _check_slices({0: p1, 1: p2}, layout, {**first, **second})


def test_missing_shard_is_named(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    p1 = _write(tmp_path / "m-00001-of-00002.gguf", "qwen3moe", _moe_tensors(rng, range(1)))
    with pytest.raises(LayoutError, match="m-00002-of-00002.gguf"):
        read_layout(p1)


def test_unknown_arch_is_refused_by_name(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.gguf", "mystery-moe", _moe_tensors(np.random.default_rng(4), range(1)))
    with pytest.raises(UnsupportedArchError, match="architecture 'mystery-moe'"):
        read_layout(path)


def test_dense_model_has_nothing_to_stream(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.gguf", "llama", {"blk.0.ffn_up.weight": np.zeros((4, 8), np.float32)})
    with pytest.raises(NothingToStreamError, match="nothing to stream"):
        read_layout(path)


def test_llama_streams_only_when_the_file_has_experts(tmp_path: Path) -> None:
    """Mixtral is general.architecture "llama" with experts; Llama and Mistral are "llama" without."""
    rng = np.random.default_rng(6)
    moe = read_layout(_write(tmp_path / "mixtral.gguf", "llama", _moe_tensors(rng, range(2))))
    assert moe.arch == "llama" and moe.layers == (0, 1) and moe.n_expert == N_EXPERT
    dense = _write(tmp_path / "llama.gguf", "llama", {"blk.0.ffn_up.weight": np.zeros((4, 8), np.float32)})
    with pytest.raises(NothingToStreamError, match=r"\(llama\) has no expert tensors"):
        read_layout(dense)


def test_smollm2_dense_says_nothing_to_stream() -> None:
    from bmoe.testing.smollm2 import smollm2_gguf_path

    path = smollm2_gguf_path()
    with pytest.raises(NothingToStreamError, match="dense model"):
        read_layout(path)


def test_registry_lists_the_required_archs() -> None:
    names = {e.arch for e in list_archs()}
    # issue #13's "must" list: each runs its gates on a tiny model (tests/gates/test_arch_registry.py)
    assert {
        "qwen3moe",
        "qwen35moe",
        "qwen2moe",
        "olmoe",
        "gpt-oss",
        "gemma4",
        "qwen3next",
        "lfm2moe",
        "deepseek2",
        "glm4moe",
        "llama",
        "granitehybrid",
    } <= names
    text = format_archs()
    assert all(a in text for a in names) and "ffn_moe_topk" in text
    assert lookup("qwen35moe").streams("ffn_gate_up_exps.weight")
    assert not lookup("qwen2moe").streams("ffn_up_shexp.weight")  # shared expert stays resident
    assert lookup("olmoe").route_name(5) == "ffn_moe_topk-5"


def test_stream_package_imports_neither_ctypes_nor_llama_cpp() -> None:
    import ast

    import bmoe.stream

    root = Path(bmoe.stream.__file__).parent
    for py in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(py.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert name.split(".")[0] not in ("ctypes", "llama_cpp"), f"{py.name} imports {name}"


def _assert_header_matches_gguf_reader(path: Path) -> None:
    from bmoe.stream.layout import read_header

    header = read_header(path)
    reader = gguf.GGUFReader(path, "r")
    want = [(t.name, int(t.data_offset), int(t.n_bytes), tuple(int(d) for d in t.shape)) for t in reader.tensors]
    assert [(t.name, t.offset, t.nbytes, t.ne) for t in header.tensors] == want
    for key, field in reader.fields.items():
        # GGUFReader adds pseudo-fields for the header counts ("GGUF.version", ...).
        if not key.startswith("GGUF.") and field.types[0] != gguf.GGUFValueType.ARRAY:
            assert header.fields[key] == field.contents(), key


def test_header_walk_agrees_with_gguf_reader(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    tensors = {"token_embd.weight": rng.standard_normal((10, N_EMBD)).astype(np.float32), **_moe_tensors(rng, range(2))}
    w = gguf.GGUFWriter(str(tmp_path / "a.gguf"), "qwen3moe")
    w.add_uint32("qwen3moe.expert_used_count", 2)
    w.add_custom_alignment(64)  # a non-default alignment moves the data section
    w.add_array("test.strings", ["a", "bc", ""])
    w.add_array("test.ints", [1, 2, 3])
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_float32("test.f", 0.5)
    w.add_bool("test.b", True)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _assert_header_matches_gguf_reader(tmp_path / "a.gguf")


def test_short_integer_arrays_are_decoded_and_per_layer_head_counts_size_the_kv(tmp_path: Path) -> None:
    """Per-layer hparams (step35's attention.head_count, head_count_kv) come back as tuples, so the
    KV estimate can sum each layer's KV heads; long arrays (a vocabulary's) and the rest are skipped."""
    from bmoe.runtime.footprint import kv_bytes_per_sequence
    from bmoe.stream.layout import read_header

    rng = np.random.default_rng(6)
    w = gguf.GGUFWriter(str(tmp_path / "a.gguf"), "step35")
    w.add_uint32("step35.block_count", 3)
    w.add_uint32("step35.embedding_length", N_EMBD)
    w.add_array("step35.attention.head_count", [4, 8, 4, 4])  # a NextN block's entry after the trunk
    w.add_array("step35.attention.head_count_kv", [2, 1, 2, 2])
    w.add_uint32("step35.attention.key_length", 16)
    w.add_uint32("step35.attention.value_length", 16)
    w.add_array("test.long", list(range(2000)))
    w.add_array("test.bools", [True, False])
    w.add_array("test.floats", [0.5])
    w.add_tensor("token_embd.weight", rng.standard_normal((10, N_EMBD)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    fields = read_header(tmp_path / "a.gguf").fields
    assert fields["step35.attention.head_count"] == (4, 8, 4, 4)
    assert fields["step35.attention.head_count_kv"] == (2, 1, 2, 2)
    assert not {"test.long", "test.bools", "test.floats"} & fields.keys()
    assert kv_bytes_per_sequence(tmp_path / "a.gguf", 100, False) == 100 * (2 + 1 + 2) * (16 + 16) * 2


def test_header_walk_agrees_with_gguf_reader_on_the_tiny_models(tiny_models) -> None:
    # A real 49k-token vocabulary (string arrays), F32 and K-quant tensors.
    for quant in ("f32", "q4_k_m"):
        _assert_header_matches_gguf_reader(tiny_models("qwen3moe", quant))


def test_a_truncated_header_is_a_layout_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.gguf", "qwen3moe", _moe_tensors(np.random.default_rng(6), range(1)))
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:60])
    with pytest.raises(LayoutError, match="cannot read GGUF"):
        read_layout(tmp_path / "cut.gguf")
    (tmp_path / "bad.gguf").write_bytes(b"GGUX" + data[4:])
    with pytest.raises(LayoutError, match="bad magic"):
        read_layout(tmp_path / "bad.gguf")


def test_a_tensor_past_the_end_of_its_file_is_refused_by_name(tmp_path: Path) -> None:
    tensors = _moe_tensors(np.random.default_rng(7), range(2))
    data = _write(tmp_path / "m.gguf", "qwen3moe", tensors).read_bytes()
    last = max(read_layout(tmp_path / "m.gguf").experts, key=lambda t: t.offset)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: last.offset + last.nbytes - 1])  # one byte short of the last expert
    with pytest.raises(
        LayoutError,
        match=rf"^GGUF {cut} is truncated or damaged: tensor {last.name} needs "
        rf"bytes {last.offset}\.\.{last.offset + last.nbytes} but the file "
        rf"has {last.offset + last.nbytes - 1} bytes$",
    ):
        read_layout(cut)


def test_a_truncated_shard_is_named(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    p1 = _write(tmp_path / "m-00001-of-00002.gguf", "qwen3moe", _moe_tensors(rng, range(0, 1)), {"split.count": 2})
    p2 = _write(tmp_path / "m-00002-of-00002.gguf", "qwen3moe", _moe_tensors(rng, range(1, 2)), {"split.count": 2})
    p2.write_bytes(p2.read_bytes()[:-4096])
    with pytest.raises(LayoutError, match=rf"^GGUF {p2} is truncated or damaged"):
        read_layout(p1)


def test_an_empty_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "e.gguf").write_bytes(b"")
    with pytest.raises(LayoutError, match=rf"^cannot read GGUF {tmp_path / 'e.gguf'}: the file is empty"):
        read_layout(tmp_path / "e.gguf")


def _small_gguf(path: Path) -> Path:
    """Every kind of header item (strings, arrays of strings and numbers, nested arrays) and
    tensors small enough that every prefix of the file can be tried."""
    rng = np.random.default_rng(9)
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_uint32("qwen3moe.expert_used_count", 2)
    w.add_array("test.strings", ["a", "bc", ""])
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_string("test.s", "hello")
    w.add_tensor("token_embd.weight", rng.standard_normal((3, 8)).astype(np.float32))
    w.add_tensor("blk.0.ffn_up_exps.weight", rng.standard_normal((4, 2, 8)).astype(np.float32))
    w.add_tensor("blk.0.ffn_down_exps.weight", rng.standard_normal((4, 8, 2)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_every_prefix_of_a_gguf_is_refused_by_name_or_read_whole(tmp_path: Path) -> None:
    data = _small_gguf(tmp_path / "m.gguf").read_bytes()
    experts = read_layout(tmp_path / "m.gguf").experts
    start, end = min(t.offset for t in experts), max(t.offset + t.nbytes for t in experts)
    cut = tmp_path / "cut.gguf"
    for n in [*range(start), *range(start, len(data), 7)]:  # every header byte, then a sample
        cut.write_bytes(data[:n])
        if n >= end:  # only alignment padding is missing: nothing the layout needs
            read_layout(cut)
            continue
        with pytest.raises(LayoutError, match=f"GGUF {cut}"):
            read_layout(cut)


def test_damaged_header_bytes_raise_only_model_file_errors(tmp_path: Path) -> None:
    # Whatever a damaged byte turns into (a huge count, an unknown type, a zero alignment), the
    # layout either reads or is refused with a ModelFileError; never a stray ValueError/IndexError.
    from bmoe.errors import ModelFileError

    data = _small_gguf(tmp_path / "m.gguf").read_bytes()
    header_end = min(t.offset for t in read_layout(tmp_path / "m.gguf").experts)
    rng = np.random.default_rng(10)
    bad = tmp_path / "bad.gguf"
    for _ in range(400):
        b = bytearray(data)
        for pos in rng.integers(0, header_end, size=int(rng.integers(1, 4))):
            b[pos] = int(rng.integers(0, 256))
        bad.write_bytes(bytes(b))
        try:
            read_layout(bad)
        except ModelFileError as e:
            assert str(bad) in str(e) or "architecture" in str(e), str(e)


def test_arrays_nested_past_any_writer_are_a_layout_error(tmp_path: Path) -> None:
    # ARRAY of ARRAY of ARRAY ...: walked by recursion, a few kB of such bytes would exhaust the
    # interpreter's stack (RecursionError, naming no file); the walk stops at a fixed depth.
    import struct

    depth = 3000
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 4) + b"deep" + struct.pack("<I", 9)
    body += struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 4, 0)
    (tmp_path / "deep.gguf").write_bytes(body)
    with pytest.raises(LayoutError, match=rf"^cannot read GGUF {tmp_path / 'deep.gguf'}: arrays nested more than 8"):
        read_layout(tmp_path / "deep.gguf")


def test_an_expert_tensor_without_bytes_is_refused_by_name(tmp_path: Path) -> None:
    tensors = _moe_tensors(np.random.default_rng(11), range(1))
    tensors["blk.0.ffn_up_exps.weight"] = np.zeros((N_EXPERT, N_FF, 0), dtype=np.float32)  # ggml {0, n_ff, n_expert}
    path = _write(tmp_path / "m.gguf", "qwen3moe", tensors)
    with pytest.raises(
        LayoutError,
        match=rf"^{path}: expert tensor blk\.0\.ffn_up_exps\.weight has shape \[0, {N_FF}, "
        rf"{N_EXPERT}\]",
    ):
        read_layout(path)


def test_quantized_rows_that_do_not_fill_whole_blocks_are_refused_by_name(tmp_path: Path) -> None:
    # A Q8_0 tensor (blocks of 32 values) whose header says rows of 40 values: its byte size would
    # be computed from a partial block and every expert's offset would be wrong.
    tensors = _moe_tensors(np.random.default_rng(12), range(1))
    path = _write(tmp_path / "m.gguf", "qwen3moe", tensors)
    data = bytearray(path.read_bytes())
    ne = (N_EMBD, N_FF, N_EXPERT)
    info = struct_pack_ne(ne) + (0).to_bytes(4, "little")  # the up projection's dims, then type F32
    at = data.index(b"blk.0.ffn_up_exps.weight") + len("blk.0.ffn_up_exps.weight")
    assert data[at : at + len(info)] == info
    data[at + len(info) - 4 : at + len(info)] = (8).to_bytes(4, "little")  # Q8_0
    path.write_bytes(bytes(data))
    with pytest.raises(
        LayoutError,
        match=r"tensor blk\.0\.ffn_up_exps\.weight has rows of 40 values, not a multiple "
        r"of its type's block of 32",
    ):
        read_layout(path)


def struct_pack_ne(ne: tuple[int, ...]) -> bytes:
    import struct

    return struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
