"""The --session loop on a tiny model: bytes that are not UTF-8, lines over the size cap, a
reader that fails, cancels sent before their generation starts, and the ids on errors.

Every run goes through ``run_bounded``: a loop that hangs fails the test instead of the suite."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import pytest

from bmoe.cli.loop import run_session
from bmoe.config import SessionConfig
from bmoe.decide.types import DecideRequest
from bmoe.errors import RequestError
from bmoe.session import DECIDE_OFF, Session
from bmoe.wire.protocol import MAX_LINE_BYTES


@pytest.fixture(scope="module")
def tiny(tiny_models):
    s = Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=1024, n_threads=1))
    yield s
    s.close()


def run_bounded(session: Session, stdin: object, timeout: float = 30.0) -> tuple[int, list[tuple[str, dict]]]:
    """run_session on another thread; returns (exit code, [(tag, body)]) or fails on a hang."""
    out = io.StringIO()
    rc: list[int] = []
    t = threading.Thread(target=lambda: rc.append(run_session(session, stdin, out)), daemon=True)  # type: ignore[arg-type]
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"the session loop hung; it wrote:\n{out.getvalue()[-2000:]}"
    assert rc, "run_session raised"
    lines = []
    for ln in out.getvalue().splitlines():
        tag, _, body = ln.partition(" ")
        lines.append((tag, json.loads(body)))
    assert lines[0][0] == "BMOE_READY"
    return rc[0], lines[1:]


def strict_stdin(data: bytes) -> io.TextIOWrapper:
    """What sys.stdin is under PYTHONIOENCODING=utf-8: strict decoding, with a .buffer."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="strict")


def req(**kw: object) -> bytes:
    return json.dumps(kw).encode() + b"\n"


def errors(lines: list[tuple[str, dict]]) -> list[dict]:
    return [body for tag, body in lines if tag == "BMOE_ERROR"]


def dones(lines: list[tuple[str, dict]]) -> dict[int, dict]:
    return {body["id"]: body for tag, body in lines if tag == "BMOE_DONE"}


# --- 1. bytes that are not UTF-8 -----------------------------------------------------------


def test_invalid_utf8_is_refused_and_the_session_goes_on(tiny) -> None:
    data = b"\xff\n" + b'{"cmd":"stats","id":1,"x":"\xc3("}\n' + req(cmd="generate", id=2, prompt="Hi", n_predict=2)
    rc, lines = run_bounded(tiny, strict_stdin(data + req(cmd="close")))
    assert rc == 0
    e1, e2 = errors(lines)
    assert e1 == {
        "id": None,
        "fatal": False,
        "msg": "request line is not valid UTF-8: byte 0xff at offset 0 (invalid start byte)",
    }
    assert e2["msg"] == "request line is not valid UTF-8: byte 0xc3 at offset 27 (invalid continuation byte)"
    assert dones(lines)[2]["tokens"] == 2


def test_invalid_utf8_does_not_hang_bmoe_cli(tiny_models) -> None:
    """The issue's repro: strict stdin decoding, one bad byte, then close; end of input also ends it."""
    model = str(tiny_models("qwen3moe", "q8_0"))
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    cli = [sys.executable, "-m", "bmoe.cli.main", "--session", "-m", model, "-c", "256", "-t", "1"]
    for tail in (b'{"cmd":"close"}\n', b""):
        p = subprocess.run(cli, input=b"\xff\n" + tail, capture_output=True, env=env, timeout=60)
        assert p.returncode == 0, p.stderr.decode(errors="replace")[-2000:]
        out = p.stdout.decode().splitlines()
        assert out[0].startswith("BMOE_READY ") and len(out) == 2
        assert out[1].startswith(
            'BMOE_ERROR {"id":null,"fatal":false,"msg":"request line is not valid UTF-8: byte 0xff'
        )
        assert b"Traceback" not in p.stderr


# --- 2. the line-size cap ----------------------------------------------------------------


class LongLine(io.RawIOBase):
    """A stdin that serves ``head``, then ``n`` bytes of one line without holding them, then ``tail``."""

    def __init__(self, head: bytes, n: int, tail: bytes) -> None:
        self.parts = [head, None, tail]
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # noqa: ANN001
        while self.parts:
            part = self.parts[0]
            if part is None:
                k = min(len(b), self.left)
                b[:k] = b"a" * k
                self.left -= k
                if self.left == 0:
                    self.parts.pop(0)
                if k:
                    return k
                continue
            if not part:
                self.parts.pop(0)
                continue
            k = min(len(b), len(part))
            b[:k] = part[:k]
            self.parts[0] = part[k:]
            return k
        return 0


def test_an_over_long_line_is_refused_without_buffering_it(tiny) -> None:
    n = 50 * 2**20  # the 50 MB line
    stdin = io.BufferedReader(
        LongLine(
            req(cmd="stats", id=1) + b'{"cmd":"generate","id":2,"prompt":"',
            n,
            b'"}\n' + req(cmd="generate", id=3, prompt="Hi", n_predict=2),
        )
    )
    tracemalloc.start()
    try:
        rc, lines = run_bounded(tiny, stdin)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rc == 0
    assert [tag for tag, _ in lines][:2] == ["BMOE_STATS", "BMOE_ERROR"]
    assert errors(lines) == [
        {
            "id": None,
            "fatal": False,
            "msg": f"request line is longer than the limit of {MAX_LINE_BYTES} bytes (1 MiB); it was skipped",
        }
    ]
    assert dones(lines)[3]["tokens"] == 2
    assert peak < 4 * MAX_LINE_BYTES, f"the loop held {peak / 2**20:.1f} MiB for a line capped at 1 MiB"


def test_the_cap_is_exact(tiny) -> None:
    """A line of exactly MAX_LINE_BYTES (newline, and a \\r before it, not counted) is read; one byte more is not."""

    def generate_of(size: int, rid: int) -> bytes:
        head = b'{"cmd":"generate","id":%d,"n_predict":1,"prompt":"' % rid
        return head + b" " * (size - len(head) - 2) + b'"}'

    at, over = generate_of(MAX_LINE_BYTES, 1), generate_of(MAX_LINE_BYTES + 1, 2)
    at_crlf = generate_of(MAX_LINE_BYTES, 3) + b"\r\n"
    assert len(at) == MAX_LINE_BYTES
    stdin = at + b"\n" + at_crlf + over + b"\r\n" + over + b"\n" + over  # the last one has no newline
    rc, lines = run_bounded(tiny, strict_stdin(stdin))
    assert rc == 0
    read = errors(lines)[:2]  # read, then too long for n_ctx
    assert [e["id"] for e in read] == [1, 3] and all(e["msg"].startswith("prompt (") for e in read)
    assert [e["msg"].startswith("request line is longer than the limit") for e in errors(lines)[2:]] == [True] * 3


# --- the reader never dies silently --------------------------------------------------------


class FailingStdin(io.RawIOBase):
    def __init__(self, first: bytes) -> None:
        self.first = first

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # noqa: ANN001
        if not self.first:
            raise OSError(5, "Input/output error")
        k = min(len(b), len(self.first))
        b[:k], self.first = self.first[:k], self.first[k:]
        return k


def test_a_failing_stdin_is_an_error_line_and_ends_the_loop(tiny) -> None:
    rc, lines = run_bounded(tiny, io.BufferedReader(FailingStdin(req(cmd="stats", id=4))))
    assert rc == 1
    assert lines[0][0] == "BMOE_STATS"
    assert errors(lines) == [
        {"id": None, "fatal": True, "msg": "reading stdin failed: OSError: [Errno 5] Input/output error"}
    ]


# --- 5. cancel is never lost ---------------------------------------------------------------


def test_a_cancel_right_behind_its_generate_cancels_it(tiny) -> None:
    rc, lines = run_bounded(
        tiny, strict_stdin(req(cmd="generate", id=1, prompt="Tell a story", n_predict=400) + req(cmd="cancel"))
    )
    assert rc == 0
    # 0 tokens when the cancel is read before the generation starts (almost always: both lines
    # are there at once); a cancel that comes once it runs stops it at its next token.
    assert dones(lines)[1]["cancelled"] is True and dones(lines)[1]["tokens"] < 400


def test_a_request_cancelled_before_it_starts_stops_before_its_first_token(tiny) -> None:
    from bmoe.runtime.results import GenerateRequest

    history, kv = list(tiny.history), list(tiny.kv.tokens)
    cancel = threading.Event()
    cancel.set()
    it = tiny.generate_iter(GenerateRequest(prompt="Tell a story", n_predict=400, clear_kv=False), cancel=cancel)
    with pytest.raises(StopIteration) as stop:
        next(it)
    r = stop.value.value
    assert r.cancelled and r.stop == "cancelled" and r.n_tokens == 0 and tiny.history == history
    # nothing was prefilled: the KV holds what it held
    assert r.n_prompt == 0 and r.prefill_s == 0.0 and tiny.kv.tokens == kv
    tiny.cancel()  # idle: a no-op that must not reach the next request
    assert not tiny.generate(GenerateRequest(prompt="Hi", n_predict=3)).cancelled


def test_a_cancel_takes_the_oldest_generate_read_before_it(tiny) -> None:
    g = dict(cmd="generate", prompt="Tell a story", n_predict=400)
    rc, lines = run_bounded(tiny, strict_stdin(req(**g, id=1) + req(**g, id=2) + req(cmd="cancel")))
    assert rc == 0
    assert dones(lines)[1]["cancelled"] is True
    assert dones(lines)[2]["cancelled"] is False and dones(lines)[2]["tokens"] == 400


def test_a_cancel_with_an_id_takes_that_generate(tiny) -> None:
    g = dict(cmd="generate", prompt="Tell a story", n_predict=400)
    rc, lines = run_bounded(tiny, strict_stdin(req(**g, id=1) + req(**g, id=2) + req(cmd="cancel", id=2)))
    assert rc == 0
    assert dones(lines)[1]["cancelled"] is False and dones(lines)[1]["tokens"] == 400
    assert dones(lines)[2]["cancelled"] is True


def test_a_stale_cancel_does_not_kill_a_later_request(tiny) -> None:
    """A cancel with no unfinished generate read before it (or none of its id) does nothing."""
    rc, lines = run_bounded(
        tiny,
        strict_stdin(
            req(cmd="cancel")
            + req(cmd="generate", id=5, prompt="Hi", n_predict=3)
            + req(cmd="cancel", id=99)
            + req(cmd="generate", id=6, prompt="Hi", n_predict=3)
        ),
    )
    assert rc == 0 and not errors(lines)
    assert [(d["cancelled"], d["tokens"]) for d in dones(lines).values()] == [(False, 3), (False, 3)]


# --- 6. one unknown-field rule; ids on errors ------------------------------------------------


def test_close_and_cancel_with_unknown_fields_are_refused(tiny) -> None:
    rc, lines = run_bounded(
        tiny,
        strict_stdin(
            req(cmd="close", id=8, x=1) + req(cmd="cancel", x=1) + req(cmd="generate", id=9, prompt="Hi", n_predict=2)
        ),
    )
    assert rc == 0
    assert errors(lines) == [
        {"id": 8, "fatal": False, "msg": "close: unknown field(s) 'x'"},
        {"id": None, "fatal": False, "msg": "cancel: unknown field(s) 'x'"},
    ]
    assert dones(lines)[9]["tokens"] == 2  # the refused close did not end the session


def test_a_lone_surrogate_is_refused_with_its_id(tiny) -> None:
    rc, lines = run_bounded(tiny, strict_stdin(b'{"cmd":"generate","id":3,"prompt":"a\\ud800"}\n'))
    assert rc == 0
    assert errors(lines) == [
        {
            "id": 3,
            "fatal": False,
            "msg": "generate: field 'prompt' is not valid Unicode: a lone surrogate \\ud800 at index 1",
        }
    ]


def test_the_fatal_streaming_error_carries_the_request_id(tiny_models, tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    shutil.copyfile(tiny_models("qwen3moe", "q4_k_m"), model)
    s = Session(SessionConfig(model=model, moe_stream=True, twin_dir=tmp_path / "twins", n_ctx=128, n_threads=1))
    try:
        st = model.stat()
        os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # "replaced" under the session
        rc, lines = run_bounded(
            s, strict_stdin(req(cmd="generate", id=3, prompt="Hi", n_predict=2) + req(cmd="stats", id=4))
        )
    finally:
        s.close()
    assert rc == 1
    (e,) = errors(lines)
    assert e["id"] == 3 and e["fatal"] is True and e["msg"].startswith("expert streaming failed: ")


def test_decide_in_a_session_without_it_is_refused_with_the_sessions_one_message(tiny) -> None:
    """The CLI line, the library's exception and the docs say the same words."""
    assert tiny.decider is None
    rc, lines = run_bounded(tiny, strict_stdin(req(cmd="decide", id=3, prefix="P", suffix="S", choices=["A", "B"])))
    assert rc == 0 and lines == [("BMOE_DECIDE", {"id": 3, "error": DECIDE_OFF})]
    with pytest.raises(RequestError) as refused:
        tiny.decide(DecideRequest(id=4, prefix="P", suffix="S", choices=("A", "B")))
    assert str(refused.value) == DECIDE_OFF
    docs = Path(__file__).resolve().parents[2] / "docs"
    for page in ("decide.md", "protocol.md"):
        assert DECIDE_OFF in (docs / page).read_text(), page
