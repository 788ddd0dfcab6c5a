"""POST /v1/chat/completions under gpt-oss's real template, no tools: the analysis channel comes
as ``reasoning_content`` and the final channel's text as ``content``, whole and streamed, none of
the harmony markup in either (runtime/reasoning.py). The tiny model's tokens are scripted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import bmoe.runtime.runtime as runtime_mod
from bmoe.config import SessionConfig
from bmoe.runtime.chat import ChatRenderer
from bmoe.server import ServerSettings, close_app, create_app
from bmoe.session import Session
from helpers.server import sse_events

THOUGHT, ANSWER = "The user greets; greet back.", "Hello! How can I help?"
OUT = f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>{ANSWER}"
TEMPLATE = Path(sys.prefix) / "share" / "llama.cpp" / "models" / "templates" / "openai-gpt-oss-120b.jinja"


class Scripted:
    def __init__(self, tokens: list[int]) -> None:
        self.tokens = list(tokens)

    def sample(self, logits) -> int:  # noqa: ANN001
        return self.tokens.pop(0)

    def taken(self, tok: int) -> None:
        pass


@pytest.fixture()
def oss(tiny_path, monkeypatch):
    session = Session(SessionConfig(model=tiny_path, n_ctx=1024, n_threads=1))
    session.runtime.chat = ChatRenderer("template", TEMPLATE.read_text(), "", "")
    tokens = session.model.tokenize(OUT, add_special=False, parse_special=False)
    monkeypatch.setattr(runtime_mod, "Sampler", lambda *a: Scripted(tokens))
    app = create_app(session, ServerSettings())
    with TestClient(app, base_url="http://localhost") as c:
        yield c, len(tokens)
    close_app(app)
    session.close()


def test_the_analysis_is_reasoning_content_and_the_final_channel_content(oss) -> None:
    client, n = oss
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": n})
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    assert (msg["content"], msg["reasoning_content"]) == (ANSWER, THOUGHT)


def test_streamed_the_same(oss) -> None:
    client, n = oss
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": n, "stream": True}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    deltas = [e["choices"][0]["delta"] for e in sse_events(r.text) if isinstance(e, dict) and e.get("choices")]
    assert "".join(d.get("content") or "" for d in deltas) == ANSWER
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == THOUGHT
