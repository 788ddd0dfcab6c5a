"""A multi-token-prediction (NextN) block for a tiny HF model, shaped as real checkpoints ship it.

GLM-4.5 (and DeepSeek-V3) checkpoints carry, after the last decoder layer, one more layer that
llama.cpp's converter writes as ``blk.<n_layer>`` (``<arch>.nextn_predict_layers`` = 1): a full
MoE decoder layer plus ``eh_proj``, ``enorm``, ``hnorm`` and ``shared_head.norm``. transformers
does not build it, so the recipe has transformers build the layer as an ordinary trailing one,
and this adds the NextN-only tensors and puts the config's layer count back. llama.cpp skips the
block unless asked to load it (its trunk never computes it), and so does bmoe's streaming layout.
"""

from __future__ import annotations

import json
from pathlib import Path


def add_mtp_block(folder: Path, n_layer: int, n_mtp: int, seed: int) -> None:
    """Turn layers ``n_layer .. n_layer + n_mtp - 1`` of the saved tiny model in ``folder`` into
    NextN blocks: add their NextN tensors (seeded) and set ``num_hidden_layers`` to ``n_layer``."""
    import torch
    from safetensors.torch import load_file, save_file

    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    h, std = int(cfg["hidden_size"]), float(cfg["initializer_range"])
    gen = torch.Generator().manual_seed(seed)
    for il in range(n_layer, n_layer + n_mtp):
        p = f"model.layers.{il}."
        if f"{p}input_layernorm.weight" not in tensors:
            raise ValueError(f"{weights} has no layer {il} to turn into a NextN block")
        tensors[f"{p}eh_proj.weight"] = torch.randn(h, 2 * h, generator=gen) * std
        for norm in ("enorm", "hnorm", "shared_head.norm"):
            tensors[f"{p}{norm}.weight"] = 1.0 + torch.randn(h, generator=gen) * std
    save_file(tensors, weights, metadata={"format": "pt"})
    cfg["num_hidden_layers"] = n_layer
    cfg["num_nextn_predict_layers"] = n_mtp
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
