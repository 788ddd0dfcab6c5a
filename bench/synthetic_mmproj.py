"""A synthetic vision projector (mmproj GGUF) with Qwen3-VL-30B-A3B's vision tower shapes, made to
pair with the synthetic qwen3moe of bench/synthetic_moe.py (random F16 weights).

The point is the encoder's cost, not what it sees: the tensors have the real tower's shapes
(27 blocks of hidden 1152, 16 heads, FFN 4304, patches of 16 pixels over two frames, a 48 x 48
learned position grid, the 2 x 2 merger into the language model's width), the weights are seeded
random numbers.

Projector type ``qwen3vl_merger`` (llama.cpp's clip graph of Qwen3-VL), without DeepStack. Why
this one: llama.cpp's mtmd accepts a projector beside a language model when the projector's
output width equals the model's input width (``llama_model_n_embd_inp``), and picks the image
tokens' positions from the language model's RoPE type alone, not from the projector. The qwen3vl
graph writes ``n_embd * (1 + deepstack layers)`` per token; with no DeepStack tensors in the file
that is the merger's width, 2048, the synthetic qwen3moe's ``n_embd``, and a qwen3moe (NEOX RoPE)
gives the image ordinary positions (one per token). So the encoder runs exactly the real
tower's graph, and only these differ from the real model:

- no DeepStack mergers (the real tower taps blocks 8, 16 and 24 through three more 2 x 2 mergers
  and hands their outputs to the first language-model layers): three merger MLPs, 92 M of the
  real projector's 539 M weights (17%) but about 5% of its compute per image token (the 27
  blocks are the rest), are not run, and the language model adds no DeepStack features;
- the language model gives the image one position per token, not M-RoPE's shared temporal
  position (a qwen3moe has no M-RoPE); the prefill's compute is the same;
- random F16 weights (the real conversion is BF16/F16 too), so the embeddings mean nothing.

The file is reused when its sidecar ``<name>.recipe.json`` records the same recipe hash and size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zlib
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import gguf
import numpy as np
from synthetic_moe import is_recorded, write_recorded

# Bump when the bytes a spec produces change.
RECIPE_VERSION = 1
PROJECTOR_TYPE = "qwen3vl_merger"


@dataclass(frozen=True, slots=True)
class VisionSpec:
    """The vision tower's shapes; the defaults are Qwen3-VL-30B-A3B's (its config.json
    ``vision_config``), with ``out_dim`` the language model's width (2048 there and in the
    synthetic qwen3moe)."""

    depth: int = 27
    n_embd: int = 1152
    n_head: int = 16
    n_ff: int = 4304
    patch_size: int = 16
    temporal_patch: int = 2  # two frames per patch (an image is given twice)
    merge: int = 2  # spatial merge: 2 x 2 patches per image token
    n_pos_embd: int = 2304  # learned position grid, 48 x 48
    out_dim: int = 2048  # the merger's output: the language model's n_embd
    eps: float = 1e-6
    seed: int = 30

    @property
    def image_size(self) -> int:
        """The side of the image the position grid was learned at (larger ones interpolate it)."""
        return int(round(self.n_pos_embd**0.5)) * self.patch_size

    def n_tokens(self, width: int, height: int) -> int:
        """Image tokens of a ``width`` x ``height`` image whose sides are multiples of
        ``patch_size * merge`` (and at least 8 tokens: mtmd's floor), which mtmd keeps as they are."""
        side = self.patch_size * self.merge
        if width % side or height % side:
            raise ValueError(f"{width}x{height}: sides must be multiples of {side} to keep their size")
        return (width // side) * (height // side)


def _rng(spec: VisionSpec, name: str) -> np.random.Generator:
    # One stream per tensor, keyed by name, so a tensor does not depend on write order.
    return np.random.default_rng([spec.seed, zlib.crc32(name.encode())])


@dataclass(frozen=True, slots=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order (ggml reversed)
    f16: bool  # F16 (matrices, the patch kernels), else F32 (norms, biases, positions)
    std: float
    mean: float = 0.0


def tensor_plan(spec: VisionSpec) -> list[_Tensor]:
    d, f, p = spec.n_embd, spec.n_ff, spec.patch_size
    merged = d * spec.merge * spec.merge
    patch_fan_in = spec.temporal_patch * 3 * p * p
    ts = [
        _Tensor("v.patch_embd.weight", (d, 3, p, p), True, patch_fan_in**-0.5),
        _Tensor("v.patch_embd.weight.1", (d, 3, p, p), True, patch_fan_in**-0.5),
        _Tensor("v.patch_embd.bias", (d,), False, 0.02),
        _Tensor("v.position_embd.weight", (spec.n_pos_embd, d), False, 0.02),
    ]
    for il in range(spec.depth):
        b = f"v.blk.{il}"
        ts += [
            _Tensor(f"{b}.ln1.weight", (d,), False, 0.1, 1.0),
            _Tensor(f"{b}.ln1.bias", (d,), False, 0.02),
            _Tensor(f"{b}.attn_qkv.weight", (3 * d, d), True, d**-0.5),
            _Tensor(f"{b}.attn_qkv.bias", (3 * d,), False, 0.02),
            _Tensor(f"{b}.attn_out.weight", (d, d), True, d**-0.5),
            _Tensor(f"{b}.attn_out.bias", (d,), False, 0.02),
            _Tensor(f"{b}.ln2.weight", (d,), False, 0.1, 1.0),
            _Tensor(f"{b}.ln2.bias", (d,), False, 0.02),
            _Tensor(f"{b}.ffn_up.weight", (f, d), True, d**-0.5),
            _Tensor(f"{b}.ffn_up.bias", (f,), False, 0.02),
            _Tensor(f"{b}.ffn_down.weight", (d, f), True, f**-0.5),
            _Tensor(f"{b}.ffn_down.bias", (d,), False, 0.02),
        ]
    ts += [
        _Tensor("v.post_ln.weight", (d,), False, 0.1, 1.0),  # the merger's norm
        _Tensor("v.post_ln.bias", (d,), False, 0.02),
        _Tensor("mm.0.weight", (merged, merged), True, merged**-0.5),
        _Tensor("mm.0.bias", (merged,), False, 0.02),
        _Tensor("mm.2.weight", (spec.out_dim, merged), True, merged**-0.5),
        _Tensor("mm.2.bias", (spec.out_dim,), False, 0.02),
    ]
    return ts


def tensor_data(spec: VisionSpec, t: _Tensor) -> np.ndarray:
    values = t.mean + t.std * _rng(spec, t.name).standard_normal(t.shape, dtype=np.float32)
    return values.astype(np.float16 if t.f16 else np.float32)


def recipe(spec: VisionSpec) -> str:
    parts = {
        "recipe_version": RECIPE_VERSION,
        "spec": dataclasses.asdict(spec),
        "numpy": np.__version__,
        "gguf": version("gguf"),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def is_current(path: Path, spec: VisionSpec) -> bool:
    return is_recorded(path, recipe(spec))


def mmproj_path(out_dir: Path, spec: VisionSpec) -> Path:
    return Path(out_dir) / f"mmproj-synthetic-qwen3vl-{spec.depth}x{spec.n_embd}-to{spec.out_dim}-f16.gguf"


def write_mmproj(out_dir: Path, spec: VisionSpec = VisionSpec()) -> Path:
    """Path of the synthetic projector under ``out_dir``; written only when missing or stale."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = mmproj_path(out_dir, spec)
    return write_recorded(path, recipe(spec), lambda dst: _write(spec, dst))


def _write(spec: VisionSpec, dst: Path) -> None:
    w = gguf.GGUFWriter(dst, "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_name("bmoe synthetic qwen3vl projector (Qwen3-VL-30B-A3B vision shapes, random F16, no DeepStack)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type(PROJECTOR_TYPE)
    w.add_vision_projection_dim(spec.out_dim)
    w.add_vision_image_size(spec.image_size)
    w.add_vision_patch_size(spec.patch_size)
    w.add_vision_embedding_length(spec.n_embd)
    w.add_vision_feed_forward_length(spec.n_ff)
    w.add_vision_block_count(spec.depth)
    w.add_vision_head_count(spec.n_head)
    w.add_vision_attention_layernorm_eps(spec.eps)
    w.add_vision_image_mean([0.5, 0.5, 0.5])
    w.add_vision_image_std([0.5, 0.5, 0.5])
    w.add_vision_use_gelu(True)
    w.add_vision_spatial_merge_size(spec.merge)
    w.add_vision_is_deepstack_layers([False] * spec.depth)
    w.add_string("bmoe.synthetic.recipe", recipe(spec))
    plan = tensor_plan(spec)
    for t in plan:
        dtype = np.dtype(np.float16 if t.f16 else np.float32)
        w.add_tensor_info(t.name, t.shape, dtype, int(np.prod(t.shape)) * dtype.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in plan:  # same order as the infos: write_tensor_data pops them first-in first-out
        w.write_tensor_data(tensor_data(spec, t))
    w.close()


if __name__ == "__main__":
    import argparse
    import time

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(__file__).parent / "out")
    ap.add_argument("--depth", type=int, default=None, help="vision blocks (smoke runs: fewer than 27)")
    a = ap.parse_args()
    spec = VisionSpec() if a.depth is None else VisionSpec(depth=a.depth)
    t0 = time.perf_counter()
    p = write_mmproj(a.work, spec)
    print(f"{p} ({p.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s")
