"""bmoe-server's app as a Ray Serve deployment on the two-node test cluster, against the same app
served by uvicorn in this process (what bmoe-server runs): the openai client gets the same answers.

What is compared: the chat answer's text and token counts, bit for bit (both are one session's
first request on the same settings, so the same pieces: the whole prompt, then one token at a
time), the decision's answer keys, and the refusals' status and body (auth, a bad decide)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from bmoe.config import SessionConfig
from bmoe.ray.serve import deployment
from bmoe.server import ServerSettings, close_app, create_app
from bmoe.session import Session
from helpers.rows import ANSWER_KEYS
from helpers.server import openai_client

pytestmark = pytest.mark.ray

KEY = "secret-key"
SETTINGS = ServerSettings(api_key=KEY, max_queue=2)


def _config() -> SessionConfig:
    from bmoe.testing import smollm2_gguf_path

    return SessionConfig(model=smollm2_gguf_path(), n_ctx=1024, n_predict=16, decide=True, n_threads=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def serve_url(ray_cluster) -> Iterator[str]:
    from ray import serve

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(deployment(_config(), SETTINGS), name="bmoe", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while httpx.get(url + "/health", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the Serve deployment did not become healthy"
            time.sleep(0.5)
        yield url
    finally:
        serve.shutdown()


@pytest.fixture(scope="module")
def local_url() -> Iterator[str]:
    """The app as bmoe-server runs it: uvicorn on 127.0.0.1, in a thread of this process."""
    import threading

    import uvicorn

    session = Session(_config())
    app = create_app(session, SETTINGS)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        close_app(app)
        session.close()


def _client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai_client(url, key)


def test_the_openai_client_gets_what_bmoe_server_answers(serve_url: str, local_url: str) -> None:
    def chat(url: str) -> tuple:
        r = _client(url).chat.completions.create(
            model="any", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, temperature=0
        )
        return r.choices[0].message.content, r.usage.prompt_tokens, r.usage.completion_tokens, r.model

    on_serve, here = chat(serve_url), chat(local_url)
    assert on_serve == here and on_serve[2] > 0
    models = [m.id for m in _client(serve_url).models.list().data]
    assert models == [m.id for m in _client(local_url).models.list().data]


def test_same_auth_and_refusals(serve_url: str, local_url: str) -> None:
    with pytest.raises(openai.AuthenticationError):
        _client(serve_url, "wrong").models.list()
    bad = {"prefix": "p", "suffix": "s", "choices": []}
    for path, body in (("/v1/decide", bad), ("/v1/models", None)):
        a = httpx.request(
            "POST" if body else "GET",
            serve_url + path,
            json=body,
            timeout=60,
            headers={"Authorization": f"Bearer {KEY}"} if body else {},
        )
        b = httpx.request(
            "POST" if body else "GET",
            local_url + path,
            json=body,
            timeout=60,
            headers={"Authorization": f"Bearer {KEY}"} if body else {},
        )
        assert (a.status_code, a.json()) == (b.status_code, b.json()) and a.status_code in (400, 401)


def test_a_decision_through_serve(serve_url: str, local_url: str) -> None:
    body = {"id": 4, "prefix": "You pick a letter. ", "suffix": "A or B?", "choices": ["A", "B"]}
    got = [
        httpx.post(u + "/v1/decide", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60).json()
        for u in (serve_url, local_url)
    ]
    assert tuple(got[0].get(k) for k in ANSWER_KEYS) == tuple(got[1].get(k) for k in ANSWER_KEYS)
    assert "error" not in got[0] and got[0]["best"] in (0, 1) and got[0]["id"] == 4


@pytest.mark.parametrize(
    "flags, message",
    [
        ("-p hi", "-p/--prompt is a bmoe-cli mode"),
        ("--session", "--session is a bmoe-cli mode"),
        ("--max-queue -1", "--max-queue must be >= 0, got -1"),
        ("--max-body-kb 0", "--max-body-kb must be >= 1, got 0"),
        ("--allowed-hosts a,,b", "--allowed-hosts: "),
        ("--no-such-flag", "unrecognized arguments: --no-such-flag"),
    ],
)
def test_build_checks_the_flags_as_bmoe_server_does(flags: str, message: str) -> None:
    from bmoe.errors import ConfigError
    from bmoe.ray.serve import build

    with pytest.raises(ConfigError) as e:
        build({"flags": flags})
    assert str(e.value).startswith(message)
