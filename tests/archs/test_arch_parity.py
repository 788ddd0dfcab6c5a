"""Each tiny model of a real architecture computes what transformers computes.

The GGUF is llama.cpp's own conversion of the HF folder transformers built; the reference runs
transformers on that folder. Compared: the next-token log-softmax after every prefix of a prompt
(F32 weights, F32 KV cache, flash attention off), max |d| within the recipe's bound (1e-3 unless
a recipe says why not). Where llama.cpp rounds differently by design, the recipe reproduces the
rounding on the reference side (HfArch.reference_config) rather than widening the bound.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bmoe.config import SessionConfig
from bmoe.numerics import log_softmax
from bmoe.session import Session
from bmoe.testing import HF_ARCHS, hf_arch, load_reference

pytestmark = pytest.mark.reference

PROMPT = "Mixture-of-experts models route every token to a few experts, so phones stream them."


@pytest.mark.parametrize("arch", sorted(HF_ARCHS))
def test_llama_cpp_matches_transformers(arch, tiny_models, tiny_dir) -> None:
    cfg = SessionConfig(
        model=tiny_models(arch, "f32"), n_ctx=128, n_batch=128, n_ubatch=128, kv_f32=True, flash_attn=False, chat="none"
    )
    with Session(cfg) as s:
        tokens = s.tokenize_prompt(PROMPT)
        with torch.no_grad():
            ref = log_softmax(
                load_reference(arch, tiny_dir)(torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()
            )
        worst = 0.0
        for n in range(1, len(tokens) + 1):
            ours = s.next_token_logprobs(tokens[:n])
            worst = max(worst, float(np.max(np.abs(ours - ref[n - 1]))))
    print(f"\n{arch}: max |d log-softmax| over {len(tokens)} prefixes = {worst:.3g}")
    assert worst <= hf_arch(arch).parity_tol, f"{arch}: max |d log-softmax| = {worst:.3g}"
