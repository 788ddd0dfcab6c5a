"""bmoe against transformers, an implementation that shares no code with llama.cpp.

1. The tiny F32 fixtures are the architectures they claim: the next-token log-softmax bmoe
   computes (llama.cpp, f32 KV cache, flash attention off) matches transformers' Qwen3Moe /
   Qwen3_5Moe model built from the very same HF-form weights, at every prefix of a prompt.
2. SmolLM2's chat rendering through bmoe (the GGUF's template in jinja2, llama.cpp's tokenizer)
   equals transformers' ``apply_chat_template`` on a tokenizer built from the same GGUF.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from bmoe.config import SessionConfig  # noqa: E402
from bmoe.numerics import log_softmax  # noqa: E402
from bmoe.runtime.chat import Message  # noqa: E402
from bmoe.session import Session  # noqa: E402
from bmoe.testing import hf_weights_for, smollm2_gguf_path  # noqa: E402

pytestmark = pytest.mark.reference

# design.md measured 2e-6 / 1.1e-5 on 64-wide fixtures; these are 256 wide with sharper logits.
LOGPROB_TOL = 1e-3
PROMPT = "Mixture-of-experts models route every token to a few experts, so phones stream them."

_HF_CLASSES = {
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "qwen35moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
}


def _hf_model(arch: str) -> object:
    weights = hf_weights_for(arch)
    config_cls, model_cls = (getattr(transformers, n) for n in _HF_CLASSES[arch])
    config = config_cls(**weights.config)
    config._attn_implementation = "eager"  # plain matmul + softmax: the simplest reference
    torch.manual_seed(0)  # the random init is overwritten below; keep it reproducible anyway
    model = model_cls(config)
    state = {k: torch.from_numpy(v) for k, v in weights.state_dict.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # The head is tied to the embedding, so it is the only parameter the dict may leave out.
    assert unexpected == [] and missing in ([], ["lm_head.weight"]), (missing, unexpected)
    model.tie_weights()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model.eval()


@pytest.fixture(scope="module", params=["qwen3moe", "qwen35moe"])
def tiny_session(request: pytest.FixtureRequest, tiny_models) -> Iterator[tuple[str, Session]]:
    arch = request.param
    cfg = SessionConfig(
        model=tiny_models(arch, "f32"), n_ctx=128, n_batch=128, n_ubatch=128, kv_f32=True, flash_attn=False, chat="none"
    )
    with Session(cfg) as session:
        yield arch, session


def test_tiny_logprobs_match_transformers(tiny_session: tuple[str, Session]) -> None:
    arch, session = tiny_session
    tokens = session.tokenize_prompt(PROMPT)
    assert len(tokens) == 21  # SmolLM2's BPE, no BOS
    with torch.no_grad():
        hf_logits = _hf_model(arch)(torch.tensor([tokens]), use_cache=False).logits[0].numpy()
    hf_logprobs = log_softmax(hf_logits)  # [n_tokens, n_vocab]
    worst = 0.0
    # Every prefix, each in a fresh KV: a wrong rope, norm or recurrent-state rule shows up at
    # some position even when the last one happens to agree.
    for n in range(1, len(tokens) + 1):
        ours = session.next_token_logprobs(tokens[:n])
        assert ours.shape == (49152,)
        delta = float(np.max(np.abs(ours - hf_logprobs[n - 1])))
        worst = max(worst, delta)
        assert delta < LOGPROB_TOL, f"{arch}: max |d log p| = {delta:.3g} after {n} tokens"
        assert int(np.argmax(ours)) == int(np.argmax(hf_logprobs[n - 1]))
    print(f"\n{arch}: max |d log-softmax| over {len(tokens)} prefixes = {worst:.3g}")


CONVERSATIONS = [
    [Message("user", "What is 2+2? Answer briefly.")],
    [
        Message("system", "You route requests. Reply with one word."),
        Message("user", "Übersetze: «hello, world» 👋\n\n```py\nprint(1)\n```"),
        Message("assistant", "Hallo, Welt."),
        Message("user", "  and now tabs\tand trailing spaces  "),
    ],
]


@pytest.fixture(scope="module")
def smollm2() -> tuple[Path, Session]:
    path = smollm2_gguf_path()
    with Session(SessionConfig(model=path, n_ctx=512)) as session:
        yield path, session


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2: tuple[Path, Session]) -> object:
    path, _ = smollm2
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["one-turn", "multi-turn"])
def test_smollm2_chat_rendering_matches_transformers(smollm2, hf_tokenizer, conversation) -> None:
    _, session = smollm2
    text = session.render(conversation, think=True)
    ours = session.tokenize_prompt(text)
    messages = [{"role": m.role, "content": m.content} for m in conversation]
    hf_text = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    hf_ids = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert text == hf_text
    assert ours == list(hf_ids)
    assert text.endswith("<|im_start|>assistant\n")
