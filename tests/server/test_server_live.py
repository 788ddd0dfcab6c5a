"""Against a live uvicorn on 127.0.0.1: the official openai client unchanged, client disconnects,
the tiny MoE streamed from flash, and the bmoe-server command itself."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from bmoe.server import ServerSettings
from helpers.server import label_sets, metric, openai_client


def client_for(url: str, key: str = "none") -> openai.OpenAI:
    return openai_client(url, key, timeout=60)


def test_openai_client_chat_streamed_and_not(make_app, smol_path, live) -> None:
    server = live(make_app(smol_path))
    oa = client_for(server.url)
    assert [m.id for m in oa.models.list().data] == ["SmolLM2-135M-Instruct.Q4_1"]
    msgs = [{"role": "user", "content": "Name three fruits."}]
    # A warm-up first: a fresh server prefills the prompt whole, a repeat reuses all but its last
    # token; compared text must come from the same pieces (docs/testing.md), so both answers below
    # are repeats.
    oa.chat.completions.create(model="smol", messages=msgs, max_tokens=12, temperature=0)
    r = oa.chat.completions.create(model="smol", messages=msgs, max_tokens=12, temperature=0)
    text = r.choices[0].message.content
    assert text and r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"
    stream = oa.chat.completions.create(
        model="smol", messages=msgs, max_tokens=12, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == 12
    # the next turn continues the session: the KV prefix is reused
    r2 = oa.chat.completions.create(
        model="smol",
        max_tokens=8,
        messages=msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": "Which one is red?"}],
    )
    assert r2.usage.prompt_tokens_details.cached_tokens > 0


def test_openai_client_with_an_api_key(make_app, tiny_path, live) -> None:
    server = live(make_app(tiny_path, ServerSettings(api_key="k3y")))
    with pytest.raises(openai.AuthenticationError):
        client_for(server.url, "wrong").models.list()
    r = client_for(server.url, "k3y").chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert r.usage.completion_tokens == 3
    assert httpx.get(server.url + "/health").status_code == 200


# The tiny MoE's random weights under greedy decoding repeat one word and never end the answer,
# so a long generation is certain to be still running when the client leaves.
LONG = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 3500}


def test_disconnect_cancels_and_the_session_stays_usable(make_app, tiny_path, live) -> None:
    app = make_app(tiny_path, n_ctx=4096)
    server = live(app)
    session = app.state.session
    history = list(session.history)
    body = {**LONG, "stream": True}
    with httpx.Client(timeout=30) as c, c.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen >= 3:
                break  # leave mid-generation: the connection closes with the stream
    deadline = time.monotonic() + 20
    while metric(httpx.get(server.url + "/metrics").text, "bmoe_cancelled_total") < 1:
        assert time.monotonic() < deadline, "the generation was not cancelled"
        time.sleep(0.1)
    text = httpx.get(server.url + "/metrics").text
    assert metric(text, "bmoe_chat_completions_total", finish_reason="cancelled") == 1
    assert label_sets(text, "bmoe_chat_completions_total") == [{"finish_reason": "cancelled"}]  # the only turn
    # the client saw tokens before it left, and the generation stopped long before max_tokens
    assert 0 < metric(text, "bmoe_completion_tokens_total") < LONG["max_tokens"]
    assert session.history == history  # the turn was rolled back
    r = client_for(server.url).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert r.usage.completion_tokens >= 1


def test_a_non_streamed_client_that_gives_up_cancels_too(make_app, tiny_path, live) -> None:
    app = make_app(tiny_path, n_ctx=4096)
    server = live(app)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=LONG, timeout=1.0)
    deadline = time.monotonic() + 20
    while metric(httpx.get(server.url + "/metrics").text, "bmoe_cancelled_total") < 1:
        assert time.monotonic() < deadline, "the generation was not cancelled"
        time.sleep(0.1)
    assert app.state.session.history == []
    m = httpx.get(server.url + "/metrics").text
    assert label_sets(m, "bmoe_chat_completions_total") == [{"finish_reason": "cancelled"}]  # stopped while it ran
    assert metric(m, "bmoe_chat_completions_total", finish_reason="cancelled") == 1
    assert metric(m, "bmoe_completion_tokens_total") < LONG["max_tokens"]
    assert httpx.get(server.url + "/health").json()["queue"] == 0


def test_streamed_moe_reports_flash_reads(make_app, tiny_path, live) -> None:
    app = make_app(tiny_path, moe_stream=True, cache_mb="auto")
    server = live(app)
    r = httpx.post(
        server.url + "/v1/chat/completions",
        timeout=60,
        json={"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4},
    ).json()
    assert r["bmoe"]["read_mib"] > 0 and r["bmoe"]["experts_routed"] > 0
    d = httpx.post(
        server.url + "/v1/decide", timeout=60, json={"prefix": "Q.\n", "suffix": "A or B?", "choices": ["A", "B"]}
    ).json()
    assert d["read_mb"] >= 0 and "cache_hit_pct" in d
    m = httpx.get(server.url + "/metrics").text
    assert metric(m, "bmoe_flash_read_mib_total") >= r["bmoe"]["read_mib"] > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_bmoe_server_command(smol_path) -> None:
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "bmoe.server",
        "-m",
        str(smol_path),
        "-c",
        "512",
        "-n",
        "4",
        "-t",
        "1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    bad = subprocess.run(cmd + ["-p", "hi"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "bmoe-cli mode" in bad.stderr
    proc = subprocess.Popen(
        cmd + ["--allowed-hosts", "bmoe.test"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "BMOE_API_KEY": ""},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "bmoe-server did not come up"
            time.sleep(0.2)
        info = httpx.get(url + "/v1/session").json()
        assert info["decide"] is True and info["n_ctx"] >= 512 and info["config"]["n_predict"] == 4
        r = httpx.post(url + "/v1/decide", json={"prefix": "Q.\n", "suffix": "A or B?", "choices": ["A", "B"]})
        assert r.status_code == 200
        # the Host allow-list: localhost always, --allowed-hosts' names, nothing else (DNS rebinding)
        assert httpx.get(url + "/health", headers={"Host": f"bmoe.test:{port}"}).status_code == 200
        r = httpx.get(url + "/health", headers={"Host": "rebound.example"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "host_not_allowed"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 0
