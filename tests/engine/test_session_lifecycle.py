"""Opening and closing a session: a half-opened one frees what it holds; close() never frees the
model under a request another thread still runs; refused token ids leave the session as it was."""

from __future__ import annotations

import threading

import pytest

import bmoe.session as session_mod
from bmoe.config import SessionConfig
from bmoe.errors import ModelFileError, RequestError
from bmoe.runtime.chat import ChatRenderer
from bmoe.runtime.results import GenerateRequest
from bmoe.runtime.runtime import Runtime
from bmoe.session import Session


def _slow_generation(s: Session) -> tuple[threading.Thread, threading.Event, list]:
    """A generation on another thread, held inside its first step until ``go`` is set."""
    go, started, out = threading.Event(), threading.Event(), []

    def on_step(_step) -> None:  # noqa: ANN001
        started.set()
        go.wait(30)

    t = threading.Thread(
        target=lambda: out.append(s.generate(GenerateRequest(prompt="Hello", n_predict=8), on_step=on_step))
    )
    t.start()
    assert started.wait(30)
    return t, go, out


def test_close_waits_for_a_request_on_another_thread_and_cancels_it(tiny_models) -> None:
    s = Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=256, n_threads=1))
    t, go, out = _slow_generation(s)
    closer = threading.Thread(target=s.close)
    closer.start()
    closer.join(0.5)
    assert closer.is_alive()  # waiting for the generation, not freeing the context under it
    go.set()
    closer.join(30)
    t.join(30)
    assert not closer.is_alive() and out[0].cancelled  # close() cancelled it at its next token
    assert s.runtime.ctx.ptr is None and s.runtime.model.ptr is None


def test_close_leaves_the_model_to_the_process_when_a_request_will_not_end(tiny_models, monkeypatch, capsys) -> None:
    monkeypatch.setattr(session_mod, "CLOSE_WAIT_S", 0.2)
    s = Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=256, n_threads=1))
    t, go, out = _slow_generation(s)
    s.close()
    assert s.runtime.ctx.ptr is not None  # not freed under the running request
    assert "still ran 0 s after close()" in capsys.readouterr().err
    go.set()
    t.join(30)
    s.runtime.close()


def test_a_half_opened_session_frees_its_model(tiny_models, monkeypatch) -> None:
    closed = []
    real_close = Runtime.close

    def fail(self, config) -> None:  # noqa: ANN001
        raise RuntimeError("the context could not be made")

    def spy_close(self) -> None:  # noqa: ANN001
        closed.append(self.model.ptr is not None)
        real_close(self)

    monkeypatch.setattr(Runtime, "_open_rest", fail)
    monkeypatch.setattr(Runtime, "close", spy_close)
    with pytest.raises(RuntimeError, match="context could not be made"):
        Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=256, n_threads=1))
    assert closed == [True]  # the loaded model was freed, not leaked


def test_token_ids_out_of_the_vocabulary_are_refused_before_the_kv_changes(tiny_models) -> None:
    with Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=256, n_threads=1)) as s:
        s.generate(GenerateRequest(prompt="Hello", n_predict=2))
        kv = list(s.runtime.kv.tokens)
        n_vocab = s.runtime.model.n_vocab
        for bad in (2**32 + 5, n_vocab, -1):  # 2**32 + 5 would wrap to 5 in llama.cpp's int32 batch
            with pytest.raises(RequestError, match=rf"^tokens\.1: {bad} is not a token id of this model"):
                s.next_token_logprobs([1, bad])
            with pytest.raises(RequestError, match=rf"^tokens\.1: {bad} is not a token id of this model"):
                s.perplexity(tokens=[1, bad, 2])
        assert list(s.runtime.kv.tokens) == kv


def test_a_chat_template_that_is_not_jinja_is_a_model_file_error() -> None:
    with pytest.raises(ModelFileError, match=r"^the model's chat template is not valid Jinja .*--chatml or --no-chat"):
        ChatRenderer("template", "{% if %}broken", "", "")
    assert ChatRenderer("chatml", "{% if %}broken", "", "").mode == "chatml"  # --chatml does not read it


@pytest.mark.parametrize("clear_kv", [True, False])
def test_an_empty_prompt_is_refused_and_the_session_goes_on(tiny_models, clear_kv: bool) -> None:
    """Raw chat (no template) on a model that adds no BOS: an empty prompt has no tokens. Before,
    the KV was trimmed to -1 (clear_kv false: llama.cpp dropped every position, the bookkeeping
    only its last token) or reset (clear_kv true), then decode refused the empty list with a
    message naming no field; now the prompt is refused first and nothing changes."""
    with Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), chat="none", n_ctx=256, n_threads=1)) as s:
        s.runtime.model.add_bos = False  # the premise, whatever the tiny tokenizer says
        first = s.generate(GenerateRequest(prompt="Hello", n_predict=2))
        kv = list(s.kv.tokens)
        assert len(kv) == first.n_past > 0
        s.set_history([])
        with pytest.raises(
            RequestError,
            match=r"^prompt: renders to no tokens \(no chat template, and the model "
            r"adds no BOS\); give a non-empty prompt$",
        ):
            s.generate(GenerateRequest(prompt="", n_predict=2, clear_kv=clear_kv))
        assert list(s.kv.tokens) == kv
        # usable, and its KV kept: the same prompt reuses all of it but the last token
        again = s.generate(GenerateRequest(prompt="Hello", n_predict=2, clear_kv=False))
        assert again.n_tokens == 2 and again.n_reused == first.n_prompt - 1
