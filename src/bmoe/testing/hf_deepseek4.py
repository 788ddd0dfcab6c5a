"""DeepSeek-V4's own checkpoint layout for a tiny transformers model (Fixups.checkpoint "deepseek4").

llama.cpp's converter reads DeepSeek-V4 only as DeepSeek ships it: tensors named without the
``model.`` prefix (``embed.weight``, ``layers.<i>.attn.wq_a.weight``, ``hc_head_fn``, ...), and
every routed expert projection (``layers.<i>.ffn.experts.<e>.w{1,2,3}``) packed as MXFP4: a uint8
``weight`` of two 4-bit E2M1 codes per byte (element 2i in the low nibble) and a uint8 ``scale``
of one E8M0 exponent per 32 values, which it moves into ggml's MXFP4 blocks bit for bit.
transformers' ``save_pretrained`` writes the experts as F32 (and keeps the ``model.`` prefix), so:

- ``prepare_model`` (before saving) rounds every routed expert weight onto the MXFP4 grid (per
  32 values of a row, the smallest power-of-two scale that holds the largest magnitude in 6, then
  the nearest E2M1 value, ties to the even code), so the F32 weights transformers keeps and the
  MXFP4 ones llama.cpp reads are the same numbers; and fills each hash-routed layer's
  ``tid2eid`` (transformers starts it at zero: every token would pick expert 0 four times) with
  ``num_experts_per_tok`` distinct experts per token, seeded.
- ``write_checkpoint`` (before converting) writes the saved folder in DeepSeek's layout beside it,
  with the ``compress_ratios`` and ``num_hash_layers`` config keys DeepSeek's config.json carries
  (transformers writes ``layer_types``/``mlp_layer_types`` and reads both).

The HF folder itself stays as transformers wrote it, for the reference to load.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

# The E2M1 magnitudes, by 3-bit code (the sign is bit 3): ggml's kvalues_mxfp4 halved.
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_BLOCK = 32
_RATIO = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}


def mxfp4_encode(w):
    """(codes, exponents) of an F32 ``[rows, cols]`` tensor on the MXFP4 grid: codes uint8
    ``[rows, cols]`` (sign << 3 | magnitude code), exponents uint8 ``[rows, cols / 32]`` (E8M0,
    bias 127). Values off the grid are rounded to it (nearest, ties to the even code)."""
    import torch

    rows, cols = w.shape
    if cols % _BLOCK:
        raise ValueError(f"MXFP4 rows must be whole {_BLOCK}-value blocks, not {cols}")
    g = w.detach().to(torch.float32).reshape(rows, cols // _BLOCK, _BLOCK)
    amax = g.abs().amax(dim=-1, keepdim=True)
    # the smallest 2^k with amax <= 6 * 2^k (all-zero blocks: any scale; take 2^-127's neighbour 2^0)
    k = torch.where(amax > 0, torch.ceil(torch.log2(amax / 6.0)), torch.zeros_like(amax))
    k = k + (amax > 6.0 * torch.exp2(k)).to(k.dtype)  # log2's rounding: never let 6 * 2^k fall short
    grid = torch.tensor(_E2M1)
    mag = (g.abs() / torch.exp2(k)).unsqueeze(-1)
    dist = (mag - grid).abs()
    # nearest magnitude; on a tie the even code (argmin takes the first, so prefer even explicitly)
    best = dist.min(dim=-1, keepdim=True).values
    ties = dist == best
    even = ties & (torch.arange(8) % 2 == 0)
    code = torch.where(even.any(dim=-1), even.to(torch.int8).argmax(dim=-1), ties.to(torch.int8).argmax(dim=-1))
    sign = ((g < 0) & (code > 0)).to(torch.uint8)
    codes = (sign << 3 | code.to(torch.uint8)).reshape(rows, cols)
    exps = (k.squeeze(-1) + 127).to(torch.uint8)
    return codes, exps


def mxfp4_decode(codes, exps):
    """The F32 values of ``mxfp4_encode``'s output."""
    import torch

    rows, cols = codes.shape
    mag = torch.tensor(_E2M1)[(codes & 7).long()]
    val = torch.where(codes & 8 > 0, -mag, mag).reshape(rows, cols // _BLOCK, _BLOCK)
    return (val * torch.exp2(exps.to(torch.float32) - 127.0).unsqueeze(-1)).reshape(rows, cols)


def prepare_model(model, seed: int) -> None:
    """Put the routed experts of a transformers DeepseekV4 model on the MXFP4 grid and give its
    hash-routed layers a seeded ``tid2eid`` (module docstring)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
                flat = p.reshape(-1, p.shape[-1])
                p.copy_(mxfp4_decode(*mxfp4_encode(flat)).reshape(p.shape))
        for name, b in model.named_buffers():
            if name.endswith("mlp.gate.tid2eid"):
                vocab, k = b.shape
                n_expert = model.config.n_routed_experts
                b.copy_(torch.rand(vocab, n_expert, generator=gen).argsort(dim=-1)[:, :k])


def _deepseek_name(name: str) -> str:
    """The DeepSeek checkpoint name of a tensor transformers saved. It reverts most of its renames
    itself, but keeps the ``model.`` prefix and its root names, and reverts the attention's
    ``kv_norm`` to ``norm`` (its load renames ``.norm.`` to ``.kv_norm.``, which the compressors'
    norms need; the main attention's is ``kv_norm`` in DeepSeek's files)."""
    root = {
        "model.embed_tokens.weight": "embed.weight",
        "model.norm.weight": "norm.weight",
        "model.hc_head.hc_fn": "hc_head_fn",
        "model.hc_head.hc_base": "hc_head_base",
        "model.hc_head.hc_scale": "hc_head_scale",
    }
    name = root.get(name, name.removeprefix("model."))
    return re.sub(r"^(layers\.\d+\.attn)\.norm\.weight$", r"\1.kv_norm.weight", name)


def write_checkpoint(folder: Path, dst: Path) -> Path:
    """Write the transformers-saved tiny DeepSeek-V4 in ``folder`` into ``dst`` (made) in
    DeepSeek's own layout, routed experts as MXFP4; the tokenizer files are copied."""
    import torch
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    (path,) = folder.glob("*.safetensors")
    out: dict[str, torch.Tensor] = {}
    for name, t in load_file(path).items():
        name = _deepseek_name(name)
        if ".ffn.experts." in name and name.endswith((".w1.weight", ".w2.weight", ".w3.weight")):
            codes, exps = mxfp4_encode(t)
            if not torch.equal(mxfp4_decode(codes, exps), t):
                raise ValueError(f"{name} is not on the MXFP4 grid (prepare_model was not run)")
            out[name] = (codes[:, 0::2] | codes[:, 1::2] << 4).contiguous()
            out[name.removesuffix(".weight") + ".scale"] = exps.contiguous()
        else:
            out[name] = t.contiguous()
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["compress_ratios"] = [_RATIO[t] for t in cfg["layer_types"]]
    cfg["num_hash_layers"] = sum(t == "hash_moe" for t in cfg["mlp_layer_types"])
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in folder.iterdir():  # the tokenizer's files (and generation_config.json) as they are
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "bmoe-recipe.json"):
            shutil.copy(f, dst / f.name)
    return dst
