"""Write (or reuse) a tiny fixture GGUF: ``write_tiny(arch, quant, out_dir) -> Path``.

F32 and Q8_0 files are written by ``gguf.GGUFWriter`` from the HF-form weights; Q4_K_M (and, for
the K-quant gates, Q6_K and IQ4_XS) is made from the F32 file by llama.cpp's quantizer. Every
output is byte-identical from run to run, so a file is reused when a sidecar
``<name>.recipe.json`` records the same recipe hash and size.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import gguf
import numpy as np

from bmoe.testing.convert import gguf_tensors, storage_type
from bmoe.testing.smollm2 import smollm2_gguf_path, smollm2_tokenizer_fields
from bmoe.testing.spec import ALL_QUANTS, QUANTIZED, RECIPE_VERSION, TinySpec, spec_for
from bmoe.testing.weights import hf_weights

RECIPE_KEY = "bmoe.tiny.recipe"
_FILE_TYPES = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}


def default_tiny_dir() -> Path:
    """``$BMOE_TINY_DIR`` if set, else ``~/.cache/bmoe/tiny``."""
    env = os.environ.get("BMOE_TINY_DIR")
    return Path(env) if env else Path.home() / ".cache" / "bmoe" / "tiny"


def tiny_file_name(arch: str, quant: str) -> str:
    return f"tiny-{arch}-{quant}.gguf"


def weights_recipe(spec: TinySpec) -> str:
    """Hash of everything the F32 weights and metadata depend on."""
    tok = smollm2_gguf_path()
    parts = {
        "recipe_version": RECIPE_VERSION,
        "spec": dataclasses.asdict(spec),
        "numpy": np.__version__,
        "gguf": _gguf_version(),
        "tokenizer_source": [tok.name, tok.stat().st_size],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def variant_recipe(spec: TinySpec, quant: str) -> str:
    parts = {"weights": weights_recipe(spec), "quant": quant}
    if quant in QUANTIZED:
        # llama.cpp's quantizer makes this variant: a new version may choose other types.
        parts["llama_cpp"] = _llama_cpp_version()
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


@contextmanager
def generation_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``<path>.lock``, held while the file (or folder) at ``path`` is checked
    and made: processes asking for the same tiny model at once (parallel test workers, two runs
    sharing a folder) make it once, and none replaces it under another that already uses it."""
    with open(path.with_name(f"{path.name}.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_tiny(arch: str, quant: str, out_dir: Path) -> Path:
    """Path of the tiny ``arch`` fixture in ``quant`` (``f32``, ``q8_0``, ``q4_k_m``, ``q6_k`` or
    ``iq4_xs``) under ``out_dir``, written only when missing or made by a different recipe."""
    spec = spec_for(arch)
    quant = quant.lower()
    if quant not in ALL_QUANTS:
        raise ValueError(f"unknown tiny quant {quant!r}; choose one of {', '.join(ALL_QUANTS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / tiny_file_name(arch, quant)
    with generation_lock(path):
        return _write_tiny_locked(arch, quant, out_dir, path, variant_recipe(spec, quant))


def _write_tiny_locked(arch: str, quant: str, out_dir: Path, path: Path, recipe: str) -> Path:
    spec = spec_for(arch)
    if _is_current(path, recipe):
        return path
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        if quant in QUANTIZED:
            # Imported here: only these variants need llama.cpp, and bmoe.llama owns that import.
            from bmoe.llama.quantize import quantize_gguf

            quantize_gguf(write_tiny(arch, "f32", out_dir), tmp, QUANTIZED[quant])
        else:
            _write_gguf(spec, quant, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _sidecar(path).write_text(json.dumps({"recipe": recipe, "size": path.stat().st_size}) + "\n")
    return path


def write_tiny_split(arch: str, quant: str, out_dir: Path, max_tensors: int = 24) -> Path:
    """The same weights as ``write_tiny(arch, quant)`` (f32 or q8_0) split into shards of at most
    ``max_tensors`` tensors (``-0000k-of-0000n.gguf``); returns the first shard. Always rewritten."""
    spec = spec_for(arch)
    if quant not in ("f32", "q8_0"):
        raise ValueError(f"split tiny models are written directly by gguf: f32 or q8_0, not {quant!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"tiny-{arch}-{quant}-split.gguf"
    _write_gguf(spec, quant, stem, split_max_tensors=max_tensors)
    shards = sorted(out_dir.glob(f"tiny-{arch}-{quant}-split-*-of-*.gguf"))
    if len(shards) < 2:
        raise RuntimeError(f"expected several shards for {stem}, got {[p.name for p in shards]}")
    return shards[0]


def _write_gguf(spec: TinySpec, quant: str, dst: Path, split_max_tensors: int = 0) -> None:
    writer = gguf.GGUFWriter(dst, spec.arch, split_max_tensors=split_max_tensors)
    _add_metadata(writer, spec, quant)
    for name, data in gguf_tensors(spec, hf_weights(spec).state_dict):
        qtype = storage_type(name, data, quant)
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_metadata(w: gguf.GGUFWriter, spec: TinySpec, quant: str) -> None:
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"bmoe tiny {spec.arch}")
    w.add_file_type(_FILE_TYPES[quant])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_expert_count(spec.n_expert)
    w.add_expert_used_count(spec.n_expert_used)
    w.add_expert_feed_forward_length(spec.n_ff_exp)
    w.add_vocab_size(spec.n_vocab)
    if spec.flavour.dense_ffn_length:
        w.add_feed_forward_length(spec.n_ff_exp * spec.n_expert_used)
    if spec.n_ff_shexp:
        w.add_expert_shared_feed_forward_length(spec.n_ff_shexp)
    if spec.linear is not None:
        lin = spec.linear
        w.add_rope_dimension_count(spec.n_rot)
        w.add_rope_dimension_sections([*spec.mrope_section, 0])
        w.add_ssm_conv_kernel(lin.conv_kernel)
        w.add_ssm_state_size(lin.head_k_dim)
        w.add_ssm_group_count(lin.n_k_heads)
        w.add_ssm_time_step_rank(lin.n_v_heads)
        w.add_ssm_inner_size(lin.value_dim)
        # gguf 0.19 has no helper for this key; llama.cpp reads it before full_attention_interval.
        w.add_array(f"{spec.arch}.attention.recurrent_layers", [t == "linear_attention" for t in spec.layer_types])
        w.add_full_attention_interval(spec.layer_types.index("full_attention") + 1)
    for f in smollm2_tokenizer_fields():
        w.add_key_value(f.key, f.value, f.vtype, f.sub_type)
    w.add_string(RECIPE_KEY, weights_recipe(spec))
    w.add_uint32("bmoe.tiny.seed", spec.seed)


def _sidecar(path: Path) -> Path:
    return path.with_name(f"{path.name}.recipe.json")


def _is_current(path: Path, recipe: str) -> bool:
    try:
        meta = json.loads(_sidecar(path).read_text())
        return meta.get("recipe") == recipe and meta.get("size") == path.stat().st_size
    except (OSError, ValueError):
        return False


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


def _llama_cpp_version() -> str:
    from importlib.metadata import version

    return version("llama_cpp_python")
