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

Routing knobs (all off in ``SyntheticSpec()``, the ``uniform`` preset: random routing, the worst
case for an expert cache). Real MoE routers prefer some experts and route nearby tokens alike
(/work/shared/data/route-traces/README.md); these knobs give the random model the same habits:

- ``skew``: expert popularity. Every token's embedding carries the same fixed vector ``u`` in its
  first ``SKEW_DIMS`` dimensions; each layer's router gets, on those dimensions, a column along
  ``u`` of size ``skew_l * p_e`` (``p_e`` a fixed standard normal per layer and expert). So expert
  e's router logit gets a constant bias of about ``skew_l * p_e`` token-logit standard deviations,
  on top of the token's own random part. ``skew`` lists strengths from the first to the last
  layer, interpolated over ``n_layer``, so early layers can stay near uniform. The output norm is
  zero on those dimensions, so ``u`` never reaches the logits (greedy decode does not lock on one
  token).
- ``reuse``: token-to-token reuse. Real routers pick many of the previous token's experts
  again, more than popularity explains, and that falls off within two tokens. One attention head
  per layer (q heads 0..n_head/n_head_kv-1 on KV head 0) becomes a previous-token head: its q and
  k read only ``u``, so they are the same for every token, and hold RoPE phases on the
  ``REUSE_PAIRS`` fastest pairs that make the score peak at distance 1. Its v copies the residual
  dims ``reuse_dims`` (the head's width after ``u``); attn_output adds ``reuse_l`` times the copy
  back onto the same dims; the router's token part reads only those dims (rescaled to the same
  logit std). So each layer's router input holds part of the previous token's, and the copies
  add up over the layers. The output norm is zero there too; the q_norm / k_norm weights of those
  pairs (shared by all heads) are 3, to make the peak sharp. ``reuse`` is interpolated like
  ``skew``, but since the copies add up, a value fits one layer count (6 layers needed about
  twice the 16-layer value).
- ``attn_out_scale``: the attention output's scale (``out_scale`` when unset). The attention
  output is an average over the context, which varies slowly from token to token; a larger share
  of it in the residual makes tokens route alike, but measured, it did not raise the previous
  token's overlap and at 0.5 sent greedy decoding into a cycle, so no preset uses it.

``PRESETS`` names the two specs the benchmarks use; ``preset_path`` writes (or reuses) one.

The file is reused when its sidecar ``<name>.recipe.json`` records the same recipe hash and size.
The recipe hashes only the knobs that are set, so the uniform model keeps its hash and bytes.
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
from typing import Callable

import gguf
import numpy as np

from bmoe.testing.smollm2 import smollm2_gguf_path, smollm2_tokenizer_fields

# Bump when the bytes a spec produces change.
RECIPE_VERSION = 1
Q4_0 = gguf.GGMLQuantizationType.Q4_0
_BLOCK, _BLOCK_BYTES = gguf.GGML_QUANT_SIZES[Q4_0]  # 32 values in 18 bytes
# std of (nibble - 8) with nibble 0 remapped to 8: sqrt(2 * (1+4+...+49) / 16)
_NIBBLE_STD = float(np.sqrt(2 * sum(k * k for k in range(1, 8)) / 16))
SKEW_DIMS = 64  # embedding dimensions that carry the shared popularity vector u
_SKEW_VALUE = 4.0  # |u_j|: rms of the embedding becomes sqrt((2048 - 64 + 64 * 16) / 2048) = 1.21


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
    # Routing knobs (module docstring); the defaults are the uniform model and stay out of the hash.
    skew: tuple[float, ...] = ()  # popularity strength, first..last layer (interpolated)
    reuse: tuple[float, ...] = ()  # previous-token copy strength, first..last layer
    attn_out_scale: float | None = None  # attn_output scale; None: out_scale
    label: str = ""  # file name tag ("" for the uniform model)

    def skew_of(self, il: int) -> float:
        """Layer ``il``'s popularity strength (0 when ``skew`` is empty)."""
        return _interp(self.skew, il, self.n_layer)

    def reuse_of(self, il: int) -> float:
        """Layer ``il``'s previous-token copy strength (0 when ``reuse`` is empty)."""
        return _interp(self.reuse, il, self.n_layer)


def _interp(values: tuple[float, ...], il: int, n_layer: int) -> float:
    if not values:
        return 0.0
    x = il / (n_layer - 1) if n_layer > 1 else 0.0
    return float(np.interp(x, np.linspace(0.0, 1.0, len(values)), values))


# Knob fields whose default leaves the bytes as they were before the knobs existed.
_KNOB_DEFAULTS = {"skew": (), "reuse": (), "attn_out_scale": None, "label": ""}


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
    quant: bool  # Q4_0, else F32
    std: float  # Q4_0: value std; F32: spread around ``mean``
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
    attn_scale = spec.out_scale if spec.attn_out_scale is None else spec.attn_out_scale
    ts = [_Tensor("token_embd.weight", (spec.n_vocab, d), True, spec.embed_std)]
    for il in range(spec.n_layer):
        p = f"blk.{il}"
        ts += [
            _Tensor(f"{p}.attn_norm.weight", (d,), False, 0.1, 1.0),
            _Tensor(f"{p}.attn_q.weight", (q, d), True, d**-0.5),
            _Tensor(f"{p}.attn_k.weight", (kv, d), True, d**-0.5),
            _Tensor(f"{p}.attn_v.weight", (kv, d), True, d**-0.5),
            _Tensor(f"{p}.attn_output.weight", (d, q), True, attn_scale * q**-0.5),
            _Tensor(f"{p}.attn_q_norm.weight", (hd,), False, 0.1, 1.0),
            _Tensor(f"{p}.attn_k_norm.weight", (hd,), False, 0.1, 1.0),
            _Tensor(f"{p}.ffn_norm.weight", (d,), False, 0.1, 1.0),
            # F32 router, as converters keep it: routing is what the benchmark must see vary.
            _Tensor(f"{p}.ffn_gate_inp.weight", (e, d), False, d**-0.5),
            _Tensor(f"{p}.ffn_gate_exps.weight", (e, f, d), True, d**-0.5),
            _Tensor(f"{p}.ffn_up_exps.weight", (e, f, d), True, d**-0.5),
            _Tensor(f"{p}.ffn_down_exps.weight", (e, d, f), True, spec.out_scale * f**-0.5),
        ]
    ts += [
        _Tensor("output_norm.weight", (d,), False, 0.1, 1.0),
        _Tensor("output.weight", (spec.n_vocab, d), True, d**-0.5),
    ]
    return ts


def _hashed_fields(spec: SyntheticSpec) -> dict:
    """The spec as hashed: knobs at their default are left out, so old files keep their hash."""
    d = dataclasses.asdict(spec)
    for k, default in _KNOB_DEFAULTS.items():
        if d[k] == default:
            del d[k]
    return d


def recipe(spec: SyntheticSpec) -> str:
    tok = smollm2_gguf_path()
    parts = {
        "recipe_version": RECIPE_VERSION,
        "spec": _hashed_fields(spec),
        "numpy": np.__version__,
        "gguf": version("gguf"),
        "tokenizer_source": [tok.name, tok.stat().st_size],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(f"{path.name}.recipe.json")


def is_recorded(path: Path, digest: str) -> bool:
    """Whether ``path`` is the file its sidecar says a recipe of ``digest`` wrote (same size)."""
    try:
        meta = json.loads(_sidecar(path).read_text())
        return meta.get("recipe") == digest and meta.get("size") == path.stat().st_size
    except (OSError, ValueError):
        return False


def write_recorded(path: Path, digest: str, write: Callable[[Path], None]) -> Path:
    """``path``, written by ``write`` (to a temporary file, then renamed) unless its sidecar already
    records ``digest`` for it; the sidecar is written after the file is in place."""
    if is_recorded(path, digest):
        return path
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _sidecar(path).write_text(json.dumps({"recipe": digest, "size": path.stat().st_size}) + "\n")
    return path


def is_current(path: Path, spec: SyntheticSpec) -> bool:
    return is_recorded(path, recipe(spec))


def write_synthetic(out_dir: Path, spec: SyntheticSpec = SyntheticSpec()) -> Path:
    """Path of the synthetic model under ``out_dir``; written only when missing or stale."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = f"-{spec.label}" if spec.label else ""
    path = out_dir / f"synthetic-qwen3moe-{spec.n_layer}L{tag}-q4_0.gguf"
    return write_recorded(path, recipe(spec), lambda dst: _write(spec, dst))


# The benchmarks' routing presets. "uniform" is the original model, byte for byte; "trace" is
# fitted to the Qwen3-30B-A3B route trace (docs/benchmarks.md, "Routing presets").
PRESETS: dict[str, SyntheticSpec] = {
    "uniform": SyntheticSpec(),
    "trace": SyntheticSpec(skew=(0.35, 1.35, 1.45, 1.45, 1.45), reuse=(0.02, 0.11), label="trace"),
}


def preset_path(work: Path, preset: str) -> Path:
    """The GGUF of a named preset under ``work``, written when missing or stale."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    return write_synthetic(work, PRESETS[preset])


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
        w.write_tensor_data(tensor_data(spec, t))
    w.close()


def tensor_data(spec: SyntheticSpec, t: _Tensor) -> np.ndarray:
    """One tensor's data as written: Q4_0 bytes or F32 values, with the routing knobs applied."""
    rng = _rng(spec, t.name)
    if t.quant:
        data = q4_0_blocks(rng, t.n_values, t.std)
    else:
        data = (t.mean + t.std * rng.standard_normal(t.shape, dtype=np.float32)).astype(np.float32)
    if spec.skew or spec.reuse:
        data = _apply_skew(spec, t, data)
    if spec.reuse:
        data = _apply_reuse(spec, t, data)
    return data


def skew_vector(spec: SyntheticSpec) -> np.ndarray:
    """The shared popularity vector u on the first SKEW_DIMS dimensions: fixed signs, |u_j| = 4."""
    signs = np.random.default_rng([spec.seed, 0x5E3]).integers(0, 2, SKEW_DIMS) * 2 - 1
    return (_SKEW_VALUE * signs).astype(np.float32)


def _sign_blocks(signs: np.ndarray, mag: float) -> np.ndarray:
    """Values ``mag * signs`` (signs in -1, 0, +1) as Q4_0 blocks, exactly  # [len // 32, 18] uint8"""
    n = len(signs) // _BLOCK
    out = np.empty((n, _BLOCK_BYTES), dtype=np.uint8)
    out[:, :2] = np.full(n, mag / 4, dtype=np.float16).view(np.uint8).reshape(n, 2)
    nib = (8 + 4 * np.sign(signs)).astype(np.uint8).reshape(n, 2, 16)  # low nibbles: first 16 values
    out[:, 2:] = nib[:, 0] | (nib[:, 1] << 4)
    return out


# The previous-token head (``reuse``): q heads 0 .. n_head/n_head_kv - 1 and KV head 0.
REUSE_PAIRS = 16  # highest-frequency RoPE pairs whose phases make the score peak at distance 1
_REUSE_NORM = 3.0  # q_norm / k_norm weight on those pairs: the peak beats distance 0 and 2 by ~8.6


def reuse_dims(spec: SyntheticSpec) -> tuple[int, int]:
    """Residual dims the head copies and the router's token part reads: one head's width after u."""
    return SKEW_DIMS, SKEW_DIMS + spec.head_dim


def _apply_reuse(spec: SyntheticSpec, t: _Tensor, data: np.ndarray) -> np.ndarray:
    """Write the previous-token head into layer tensors (see the module docstring).

    q and k of the head read only u (so they are the same for every token) and hold, on the
    REUSE_PAIRS fastest NEOX RoPE pairs, phases that make q.k peak at distance 1: the head attends
    to the previous token. v copies the residual dims ``reuse_dims``, and attn_output adds
    ``reuse_l`` times that copy back onto the same dims, which are the only non-u dims the router
    reads. So a token's router input holds part of the previous token's."""
    name = t.name
    if name == "output_norm.weight":  # the copies never reach the logits either
        lo, hi = reuse_dims(spec)
        data[lo:hi] = 0.0
        return data
    if not name.startswith("blk."):
        return data
    il, hd = int(name.split(".")[1]), spec.head_dim
    lo, hi = reuse_dims(spec)
    half = hd // 2
    theta = spec.rope_theta ** (-2.0 * np.arange(REUSE_PAIRS) / hd)
    u_sign = np.sign(skew_vector(spec))
    nb = spec.n_embd // _BLOCK
    sb = SKEW_DIMS // _BLOCK

    def rows(view_rows: int) -> np.ndarray:
        return data.reshape(view_rows, -1, _BLOCK_BYTES)

    def one_value_row(col: int, value: float, n_blocks: int) -> np.ndarray:
        r = np.zeros((n_blocks, _BLOCK_BYTES), dtype=np.uint8)
        b, pos = divmod(col, _BLOCK)
        r[b, :2] = np.array([value], dtype=np.float16).view(np.uint8)
        r[b, 2:] = 0x88
        r[b, 2 + pos % 16] = 0x89 if pos < 16 else 0x98
        return r

    if name.endswith(".attn_q.weight") or name.endswith(".attn_k.weight"):
        is_q = name.endswith(".attn_q.weight")
        n_rows = (spec.n_head if is_q else spec.n_head_kv) * hd
        heads = spec.n_head // spec.n_head_kv if is_q else 1
        vec = np.zeros(hd)
        vec[:REUSE_PAIRS] = np.cos(theta) if is_q else 1.0
        vec[half : half + REUSE_PAIRS] = -np.sin(theta) if is_q else 0.0
        r = rows(n_rows)
        r[: heads * hd] = 0
        for h in range(heads):
            for i in np.flatnonzero(vec):
                r[h * hd + i, :sb] = _sign_blocks(u_sign * np.sign(vec[i]), abs(float(vec[i])))
    elif name.endswith(".attn_q_norm.weight") or name.endswith(".attn_k_norm.weight"):
        data[:REUSE_PAIRS] = _REUSE_NORM
        data[half : half + REUSE_PAIRS] = _REUSE_NORM
    elif name.endswith(".attn_v.weight"):
        r = rows(spec.n_head_kv * hd)
        for i in range(hi - lo):
            r[i] = one_value_row(lo + i, 1.0, nb)
    elif name.endswith(".attn_output.weight"):
        nq = spec.n_head * hd // _BLOCK
        r = rows(spec.n_embd)
        for i in range(hi - lo):
            r[lo + i] = one_value_row(i, spec.reuse_of(il), nq) if spec.reuse_of(il) > 0 else 0
    elif name.endswith(".ffn_gate_inp.weight"):
        # The token part reads reuse_dims only, with the same logit std as before.
        data[:, hi:] = 0.0
        data[:, lo:hi] *= np.sqrt((spec.n_embd - SKEW_DIMS) / (hi - lo))
    return data


def popularity(spec: SyntheticSpec, il: int) -> np.ndarray:
    """Layer ``il``'s fixed expert popularity p_e (standard normal)  # [n_expert]"""
    return np.random.default_rng([spec.seed, 0x909, il]).standard_normal(spec.n_expert)


def _apply_skew(spec: SyntheticSpec, t: _Tensor, data: np.ndarray) -> np.ndarray:
    """Write the popularity knob into the tensors it touches (see the module docstring)."""
    u = skew_vector(spec)
    if t.name == "token_embd.weight":  # every row's first blocks := u
        rows = data.reshape(spec.n_vocab, spec.n_embd // _BLOCK, _BLOCK_BYTES)
        rows[:, : SKEW_DIMS // _BLOCK] = _sign_blocks(np.sign(u), _SKEW_VALUE)
    elif t.name == "output_norm.weight":  # u never reaches the logits
        data[:SKEW_DIMS] = 0.0
    elif t.name.endswith(".ffn_gate_inp.weight"):
        # Column col_e * u: expert e's logit gains col_e * (u . x_hat) = col_e * gain, set to
        # skew * p_e times the token part's logit std (rows of std 1/sqrt(n_embd), unit values).
        il = int(t.name.split(".")[1])
        x_rms = np.sqrt((spec.n_embd - SKEW_DIMS + SKEW_DIMS * _SKEW_VALUE**2) / spec.n_embd)
        gain = float(u @ u) / x_rms  # u . x_hat for x = (u, token part)
        token_std = np.sqrt((spec.n_embd - SKEW_DIMS) / spec.n_embd) / x_rms
        col = spec.skew_of(il) * token_std / gain * popularity(spec, il)
        data[:, :SKEW_DIMS] = col[:, None] * u[None, :]
    return data


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
    ap.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="uniform",
        help="routing preset; the flags below override its fields",
    )
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--embed-std", type=float, default=None)
    ap.add_argument("--out-scale", type=float, default=None)
    ap.add_argument(
        "--skew", type=float, nargs="+", default=None, help="popularity strength, first..last layer (interpolated)"
    )
    ap.add_argument(
        "--reuse",
        type=float,
        nargs="+",
        default=None,
        help="previous-token copy strength, first..last layer (interpolated)",
    )
    ap.add_argument("--attn-out-scale", type=float, default=None)
    ap.add_argument("--label", default=None, help="file name tag (set it when changing the knobs)")
    a = ap.parse_args()
    over = {
        "n_layer": a.layers,
        "embed_std": a.embed_std,
        "out_scale": a.out_scale,
        "skew": tuple(a.skew) if a.skew else None,
        "reuse": tuple(a.reuse) if a.reuse else None,
        "attn_out_scale": a.attn_out_scale,
        "label": a.label,
    }
    spec = dataclasses.replace(PRESETS[a.preset], **{k: v for k, v in over.items() if v is not None})
    t0 = time.perf_counter()
    p = write_synthetic(a.work, spec)
    print(f"{p} ({p.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s")
