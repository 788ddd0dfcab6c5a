"""A synthetic Qwen3-30B-A3B-shaped qwen3moe GGUF for the streaming benchmark (random Q4_0).

The point is the I/O pattern, not the text: every tensor has the real model's per-layer shape
(hidden 2048, 32 query / 4 KV heads of 128, 128 experts of FFN 768, top-8), only the layer count
is cut (16 instead of 48) so the file is about 5.5 GB. Q4_0 blocks are written directly from
random bytes, which is ~100x faster than quantizing floats, tensor by tensor, so memory stays
at one stacked expert tensor (~113 MB).

Q4_0 block: an f16 scale ``d`` then 16 bytes of nibbles; value = d * (nibble - 8). Uniform
nibbles 0..15 would average -0.5 (a bias every matmul adds up, until greedy decode repeats one
token and routing stops varying), so nibble 0 is remapped to 8: the values -7..7 (0 twice as
likely) are exactly zero-mean. ``d`` is set so a row has the std of a 1/sqrt(fan_in) init.

The file is reused when its sidecar ``<name>.recipe.json`` records the same recipe hash and size.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import zlib
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import gguf
import numpy as np

from bmoe.testing.smollm2 import smollm2_gguf_path, smollm2_tokenizer_fields

# Bump when the bytes a spec produces change.
RECIPE_VERSION = 1
Q4_0 = gguf.GGMLQuantizationType.Q4_0
_BLOCK, _BLOCK_BYTES = gguf.GGML_QUANT_SIZES[Q4_0]  # 32 values in 18 bytes
# std of (nibble - 8) with nibble 0 remapped to 8: sqrt(2 * (1+4+...+49) / 16)
_NIBBLE_STD = float(np.sqrt(2 * sum(k * k for k in range(1, 8)) / 16))


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    n_layer: int = 16
    n_embd: int = 2048
    n_head: int = 32
    n_head_kv: int = 4
    head_dim: int = 128
    n_expert: int = 128
    n_expert_used: int = 8
    n_ff_exp: int = 768
    n_vocab: int = 49152  # SmolLM2's tokenizer is copied in
    n_ctx_train: int = 32768
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    # The residual stream must stay dominated by the token itself: with a small embedding, the
    # attention output (an average over the same context) dominates and consecutive tokens route
    # to almost the same experts. So: a unit embedding, and attention/expert outputs scaled down.
    embed_std: float = 1.0
    out_scale: float = 0.25  # attn_output and ffn_down_exps std, times 1/sqrt(fan_in)
    seed: int = 30


def _lut() -> np.ndarray:
    """byte -> byte with each nibble 0 replaced by 8 (see the module docstring)."""
    b = np.arange(256, dtype=np.uint16)
    lo, hi = b & 15, b >> 4
    lo = np.where(lo == 0, 8, lo)
    hi = np.where(hi == 0, 8, hi)
    return (lo | (hi << 4)).astype(np.uint8)


_NIBBLES = _lut()


def _rng(spec: SyntheticSpec, name: str) -> np.random.Generator:
    # One stream per tensor, keyed by name, so a tensor does not depend on write order.
    return np.random.default_rng([spec.seed, zlib.crc32(name.encode())])


def q4_0_blocks(rng: np.random.Generator, n_values: int, std: float) -> np.ndarray:
    """Raw Q4_0 bytes for ``n_values`` zero-mean values of about ``std``  # [n_blocks * 18] uint8"""
    n_blocks = n_values // _BLOCK
    out = np.empty((n_blocks, _BLOCK_BYTES), dtype=np.uint8)
    # Per-block scales spread +-25% around the target, as real blocks' scales vary.
    d = (std / _NIBBLE_STD) * rng.uniform(0.75, 1.25, n_blocks)
    out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    raw = np.frombuffer(rng.bytes(n_blocks * 16), dtype=np.uint8).reshape(n_blocks, 16)
    np.take(_NIBBLES, raw, out=out[:, 2:])
    return out.reshape(-1)


@dataclass(frozen=True, slots=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order (ggml reversed): [.., rows, cols]
    quant: bool             # Q4_0, else F32
    std: float              # Q4_0: value std; F32: spread around ``mean``
    mean: float = 0.0

    @property
    def n_values(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.n_values // _BLOCK * _BLOCK_BYTES if self.quant else 4 * self.n_values


def tensor_plan(spec: SyntheticSpec) -> list[_Tensor]:
    d, hd, f, e = spec.n_embd, spec.head_dim, spec.n_ff_exp, spec.n_expert
    q, kv = spec.n_head * hd, spec.n_head_kv * hd
    ts = [_Tensor("token_embd.weight", (spec.n_vocab, d), True, spec.embed_std)]
    for il in range(spec.n_layer):
        p = f"blk.{il}"
        ts += [
            _Tensor(f"{p}.attn_norm.weight", (d,), False, 0.1, 1.0),
            _Tensor(f"{p}.attn_q.weight", (q, d), True, d ** -0.5),
            _Tensor(f"{p}.attn_k.weight", (kv, d), True, d ** -0.5),
            _Tensor(f"{p}.attn_v.weight", (kv, d), True, d ** -0.5),
            _Tensor(f"{p}.attn_output.weight", (d, q), True, spec.out_scale * q ** -0.5),
            _Tensor(f"{p}.attn_q_norm.weight", (hd,), False, 0.1, 1.0),
            _Tensor(f"{p}.attn_k_norm.weight", (hd,), False, 0.1, 1.0),
            _Tensor(f"{p}.ffn_norm.weight", (d,), False, 0.1, 1.0),
            # F32 router, as converters keep it: routing is what the benchmark must see vary.
            _Tensor(f"{p}.ffn_gate_inp.weight", (e, d), False, d ** -0.5),
            _Tensor(f"{p}.ffn_gate_exps.weight", (e, f, d), True, d ** -0.5),
            _Tensor(f"{p}.ffn_up_exps.weight", (e, f, d), True, d ** -0.5),
            _Tensor(f"{p}.ffn_down_exps.weight", (e, d, f), True, spec.out_scale * f ** -0.5),
        ]
    ts += [
        _Tensor("output_norm.weight", (d,), False, 0.1, 1.0),
        _Tensor("output.weight", (spec.n_vocab, d), True, d ** -0.5),
    ]
    return ts


def recipe(spec: SyntheticSpec) -> str:
    tok = smollm2_gguf_path()
    parts = {
        "recipe_version": RECIPE_VERSION, "spec": dataclasses.asdict(spec), "numpy": np.__version__,
        "gguf": version("gguf"), "tokenizer_source": [tok.name, tok.stat().st_size],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(f"{path.name}.recipe.json")


def is_current(path: Path, spec: SyntheticSpec) -> bool:
    try:
        meta = json.loads(_sidecar(path).read_text())
        return meta.get("recipe") == recipe(spec) and meta.get("size") == path.stat().st_size
    except (OSError, ValueError):
        return False


def write_synthetic(out_dir: Path, spec: SyntheticSpec = SyntheticSpec()) -> Path:
    """Path of the synthetic model under ``out_dir``; written only when missing or stale."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"synthetic-qwen3moe-{spec.n_layer}L-q4_0.gguf"
    if is_current(path, spec):
        return path
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        _write(spec, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _sidecar(path).write_text(json.dumps({"recipe": recipe(spec), "size": path.stat().st_size}) + "\n")
    return path


def _write(spec: SyntheticSpec, dst: Path) -> None:
    w = gguf.GGUFWriter(dst, "qwen3moe")
    _metadata(w, spec)
    plan = tensor_plan(spec)
    for t in plan:
        if t.quant:
            byte_shape = (*t.shape[:-1], t.shape[-1] // _BLOCK * _BLOCK_BYTES)
            w.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), t.nbytes, raw_dtype=Q4_0)
        else:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in plan:  # same order as the infos: write_tensor_data pops them first-in first-out
        rng = _rng(spec, t.name)
        if t.quant:
            data = q4_0_blocks(rng, t.n_values, t.std)
        else:
            data = (t.mean + t.std * rng.standard_normal(t.shape, dtype=np.float32)).astype(np.float32)
        w.write_tensor_data(data)
    w.close()


def _metadata(w: gguf.GGUFWriter, spec: SyntheticSpec) -> None:
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("bmoe synthetic qwen3moe (Qwen3-30B-A3B layer shapes, random Q4_0)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff_exp * spec.n_expert_used)
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
    for fld in smollm2_tokenizer_fields():
        w.add_key_value(fld.key, fld.value, fld.vtype, fld.sub_type)
    w.add_string("bmoe.synthetic.recipe", recipe(spec))


if __name__ == "__main__":
    import argparse
    import time

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(__file__).parent / "out")
    ap.add_argument("--layers", type=int, default=SyntheticSpec().n_layer)
    ap.add_argument("--embed-std", type=float, default=SyntheticSpec().embed_std)
    ap.add_argument("--out-scale", type=float, default=SyntheticSpec().out_scale)
    a = ap.parse_args()
    t0 = time.perf_counter()
    p = write_synthetic(a.work, SyntheticSpec(n_layer=a.layers, embed_std=a.embed_std, out_scale=a.out_scale))
    print(f"{p} ({p.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s")
