"""Generate on the tiny MoE models: determinism, KV reuse, the hybrid fallback, cancel."""
import numpy as np
import pytest

from bmoe.runtime.chat import Message
from bmoe.config import SessionConfig
from bmoe.errors import ContextOverflowError
from bmoe.runtime.results import GenerateRequest
from bmoe.session import Session


@pytest.fixture()
def open_tiny(tiny_models):
    opened: list[Session] = []

    def _open(arch: str, **kw: object) -> Session:
        kw.setdefault("n_ctx", 512)
        kw.setdefault("n_threads", 1)
        s = Session(SessionConfig(model=tiny_models(arch, "q8_0"), **kw))
        opened.append(s)
        return s

    yield _open
    for s in opened:
        s.close()


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])
def test_greedy_is_deterministic(open_tiny, arch: str) -> None:
    g = GenerateRequest(prompt="Hello", n_predict=16, keep_logits=True)
    a, b = open_tiny(arch).generate(g), open_tiny(arch).generate(g)
    assert a.tokens == b.tokens and a.n_tokens == 16
    assert all(np.array_equal(x, y) for x, y in zip(a.logits, b.logits, strict=True))


def test_continued_turn_trims_and_reuses_on_attention_model(open_tiny) -> None:
    s = open_tiny("qwen3moe")
    t1 = s.generate(GenerateRequest(prompt="Hello", n_predict=16))
    t2 = s.generate(GenerateRequest(prompt="Go on", n_predict=8, clear_kv=False))
    assert t2.n_reused > 0 and t2.n_prompt < t2.n_past and t2.prefill_fallback == ""
    fresh = open_tiny("qwen3moe")
    fresh.set_history([Message("user", "Hello"), Message("assistant", t1.text)])
    assert fresh.generate(GenerateRequest(prompt="Go on", n_predict=8, clear_kv=False)).tokens == t2.tokens


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
    assert ref.generate(GenerateRequest(prompt="Go on", n_predict=4, clear_kv=False)).tokens == after.tokens
