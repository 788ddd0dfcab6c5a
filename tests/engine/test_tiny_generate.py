"""Generate on the tiny MoE models: determinism, KV reuse, the hybrid fallback, cancel."""

import numpy as np
import pytest

from bmoe.errors import ContextOverflowError
from bmoe.runtime.chat import Message
from bmoe.runtime.results import GenerateRequest
from helpers.exactness import assert_same_up_to_near_tie

# The log-prob of a chosen token, computed in different pieces, agrees within this many nats on the
# tiny Q8_0 models (docs/testing.md "What a bit-exact test may compare").
CHUNKING_TOL = 0.5


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])
def test_greedy_is_deterministic(open_tiny, arch: str) -> None:
    g = GenerateRequest(prompt="Hello", n_predict=16, keep_logits=True)
    a, b = open_tiny(arch).generate(g), open_tiny(arch).generate(g)
    assert a.tokens == b.tokens and a.n_tokens == 16
    assert all(np.array_equal(x, y) for x, y in zip(a.logits, b.logits, strict=True))


def test_continued_turn_trims_and_reuses_on_attention_model(open_tiny) -> None:
    """The continued turn keeps the prefix the re-rendered history shares with the KV (trimming
    the part of the answer that re-tokenizes differently) and prefills the rest. Bit for bit it
    equals a fresh context fed the same pieces (with the same trim). Against the conversation
    prefilled whole, a different computation, it gives the same tokens up to the first near-tie,
    chosen log-probs within CHUNKING_TOL (docs/testing.md "What a bit-exact test may compare").
    Q8_0 rows happen to come out identical on the AVX2 and the AVX-512 builds; K-quants do not (up
    to 1.07 nats on AVX-512)."""
    s = open_tiny("qwen3moe")
    t1 = s.generate(GenerateRequest(prompt="Hello", n_predict=16))
    kv1 = list(s.kv.tokens)  # the prompt, then each answer token that was decoded
    t2 = s.generate(GenerateRequest(prompt="Go on", n_predict=8, clear_kv=False, keep_logits=True))
    assert t2.n_reused > 0 and t2.n_prompt < t2.n_past and t2.prefill_fallback == ""
    prompt2 = list(s.kv.tokens[: t2.n_reused + t2.n_prompt])
    assert prompt2[: t2.n_reused] == kv1[: t2.n_reused]

    same = open_tiny("qwen3moe")
    same.kv.append(kv1[: t1.n_prompt])
    for tok in kv1[t1.n_prompt :]:
        same.kv.append([tok])
    same.kv.rollback(t2.n_reused)
    assert np.array_equal(same.kv.append(prompt2[t2.n_reused :]), t2.logits[0])  # the same pieces: bit for bit

    fresh = open_tiny("qwen3moe")
    fresh.set_history([Message("user", "Hello"), Message("assistant", t1.text)])
    whole = fresh.generate(GenerateRequest(prompt="Go on", n_predict=8, clear_kv=False, keep_logits=True))
    assert whole.n_reused == 0 and list(fresh.kv.tokens[: whole.n_prompt]) == prompt2
    assert_same_up_to_near_tie(t2.tokens, t2.logits, whole.tokens, whole.logits, tol=CHUNKING_TOL)


def test_hybrid_divergent_history_falls_back_to_full_prefill(open_tiny) -> None:
    # The random model's output re-tokenizes differently from the tokens it generated, so the
    # re-rendered history leaves the KV before its end; recurrent state cannot be cut back.
    s = open_tiny("qwen35moe")
    t1 = s.generate(GenerateRequest(prompt="Hello", n_predict=16))
    t2 = s.generate(GenerateRequest(prompt="Go on", n_predict=8, clear_kv=False, keep_logits=True))
    assert t2.n_reused == 0 and t2.n_prompt == t2.n_past - t2.n_tokens + (t2.stop == "length")
    assert t2.prefill_fallback.startswith("memory cannot be trimmed to ") and "recurrent layers" in t2.prefill_fallback
    fresh = open_tiny("qwen35moe")
    fresh.set_history([Message("user", "Hello"), Message("assistant", t1.text)])
    whole = fresh.generate(GenerateRequest(prompt="Go on", n_predict=8, clear_kv=False, keep_logits=True))
    # Bit for bit, because the fallback runs the same pieces as the fresh session: the whole
    # conversation in one prefill into an empty KV.
    assert whole.n_reused == 0 and whole.n_prompt == t2.n_prompt
    assert whole.tokens == t2.tokens
    assert all(np.array_equal(x, y) for x, y in zip(whole.logits, t2.logits, strict=True))


def test_hybrid_history_that_extends_the_kv_is_reused(open_tiny) -> None:
    s = open_tiny("qwen35moe")
    s.generate(GenerateRequest(prompt="What?", n_predict=16))
    t2 = s.generate(GenerateRequest(prompt="Go on", n_predict=4, clear_kv=False))
    assert t2.n_reused > 0 and t2.prefill_fallback == ""


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])
def test_cancel_rolls_back_and_overflow_is_refused(open_tiny, arch: str) -> None:
    s = open_tiny(arch, n_ctx=256)
    s.generate(GenerateRequest(prompt="Hello", n_predict=8))
    history = list(s.history)
    it = s.generate_iter(GenerateRequest(prompt="Long story", n_predict=64, clear_kv=False))
    next(it)
    s.cancel()
    with pytest.raises(StopIteration) as stop:
        while True:
            next(it)
    assert stop.value.value.cancelled and s.history == history
    with pytest.raises(ContextOverflowError):
        s.generate(GenerateRequest(prompt="x " * 300))
    assert s.history == history
    after = s.generate(GenerateRequest(prompt="Go on", n_predict=4, clear_kv=False))
    ref = open_tiny(arch, n_ctx=256)
    ref.generate(GenerateRequest(prompt="Hello", n_predict=8))
    expected = ref.generate(GenerateRequest(prompt="Go on", n_predict=4, clear_kv=False))
    # Equal tokens, because both run the same pieces: the rollback left the prefix the reference
    # reuses (the hybrid's recurrent state cannot be cut back, so there neither reuses anything).
    assert (after.n_reused, after.n_prompt) == (expected.n_reused, expected.n_prompt)
    assert expected.tokens == after.tokens


def test_a_logical_batch_under_the_default_ubatch_lowers_it(open_tiny) -> None:
    """-b 128 alone (the ubatch left at its default 512): llama.cpp lowers the ubatch to 128, as its
    own tools do; the session opens and prefills a prompt longer than one batch."""
    s = open_tiny("qwen3moe", n_batch=128)
    assert (s.runtime.ctx.n_batch, s.runtime.ctx.n_ubatch) == (128, 128)
    r = s.generate(GenerateRequest(prompt="Tell me about the sea and the sky. " * 30, n_predict=2))
    assert r.n_prompt > 128 and r.n_tokens == 2
