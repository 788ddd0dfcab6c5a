"""Thousands of random and mutated request lines: the session never dies, and answers
a valid request afterwards exactly as a fresh session does. Random bytes (not UTF-8, over the
line cap, blank, lone surrogates) get one answer or one refusal per line, in order, and the
loop ends on close and on end of input."""

import io
import json
import threading
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bmoe.cli.loop import run_session
from bmoe.config import SessionConfig
from bmoe.session import Session
from bmoe.wire.protocol import MAX_LINE_BYTES

VALID = {"cmd": "generate", "id": 7, "prompt": "Name a color.", "n_predict": 3}

scalars = st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=12)
values = st.recursive(
    scalars, lambda k: st.lists(k, max_size=3) | st.dictionaries(st.text(max_size=6), k, max_size=3), max_leaves=6
)
fields = st.sampled_from(
    [
        "cmd",
        "id",
        "prompt",
        "n_predict",
        "think",
        "clear_kv",
        "temperature",
        "seed",
        "choices",
        "prefix",
        "suffix",
        "requests",
        "reuse_prefix",
        "abstain_below",
    ]
)
cmd_names = st.sampled_from(["generate", "decide", "decide_batch", "stats", "cancel", "fly", "", "GENERATE"])


@st.composite
def mutated(draw: st.DrawFn) -> str:
    obj = dict(VALID)
    obj["n_predict"] = draw(st.integers(1, 3))
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["drop", "set", "cmd"]))
        if op == "drop" and obj:
            obj.pop(draw(st.sampled_from(sorted(obj))))
        elif op == "set":
            obj[draw(fields)] = draw(values)
        else:
            obj["cmd"] = draw(cmd_names)
    if isinstance(obj.get("n_predict"), int) and not isinstance(obj.get("n_predict"), bool):
        obj["n_predict"] = min(obj["n_predict"], 3) if obj["n_predict"] >= 1 else obj["n_predict"]
    text = json.dumps(obj)
    cut = draw(st.sampled_from([None, None, None, 0.5, 0.9]))
    return text[: int(len(text) * cut)] if cut else text


lines = st.one_of(
    mutated(), st.text(max_size=40).filter(lambda s: "\n" not in s and "\r" not in s and "close" not in s)
)


def answer_text(out: str, rid: int) -> str:
    for ln in out.splitlines():
        if ln.startswith("BMOE_DONE "):
            d = json.loads(ln[len("BMOE_DONE ") :])
            if d["id"] == rid:
                return d["text"]
    raise AssertionError(f"no BMOE_DONE for id {rid} in:\n{out[-2000:]}")


def test_fuzzed_lines_never_kill_the_session(open_smol) -> None:
    s = open_smol(n_ctx=512, n_predict=3)
    ref_out = io.StringIO()
    assert run_session(s, io.StringIO(json.dumps(VALID) + "\n"), ref_out) == 0
    expected = answer_text(ref_out.getvalue(), 7)
    served = {"n": 0}

    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(lines, min_size=15, max_size=20))
    def batch(batch_lines: list[str]) -> None:
        batch_lines = [ln for ln in batch_lines if '"close"' not in ln]
        out = io.StringIO()
        assert run_session(s, io.StringIO("\n".join(batch_lines) + "\n"), out) == 0
        for ln in out.getvalue().splitlines():
            tag, _, body = ln.partition(" ")
            assert tag.startswith("BMOE_"), ln
            obj = json.loads(body)
            assert not (tag == "BMOE_ERROR" and obj["fatal"]), ln
        served["n"] += len(batch_lines)

    batch()
    assert served["n"] >= 1000
    out = io.StringIO()
    assert run_session(s, io.StringIO(json.dumps(VALID) + "\n"), out) == 0
    assert answer_text(out.getvalue(), 7) == expected


# --- random bytes: the reader's side of the loop (issue 12) ------------------------------

# (line bytes, the answer it must get: one of ERROR DONE STATS DECIDE, None for none, CLOSE)
Line = tuple[bytes, "str | None"]


def _req(obj: dict, ascii_only: bool = True) -> bytes:
    return json.dumps(obj, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


prompts = st.text(max_size=16)
generates = st.builds(
    lambda rid, p, n, a: (_req({"cmd": "generate", "id": rid, "prompt": p, "n_predict": n}, a), "DONE"),
    st.integers(0, 99),
    prompts,
    st.integers(1, 3),
    st.booleans(),
)
answered = st.one_of(
    generates,
    st.builds(lambda rid: (_req({"cmd": "stats", "id": rid}), "STATS"), st.integers(0, 99)),
    st.builds(lambda rid: (_req({"cmd": "decide", "id": rid, "choices": ["A", "B"]}), "DECIDE"), st.integers(0, 99)),
    st.sampled_from([(b'{"cmd":"cancel"}', None), (b'{"cmd":"cancel","id":3}', None), (b"", None), (b" \t\r", None)]),
)
junk = st.binary(max_size=80).filter(lambda b: b"\n" not in b and b.strip(b" \t\r") and b'"cmd"' not in b)


@st.composite
def not_utf8(draw: st.DrawFn) -> Line:
    """A request that would be answered, with a byte that cannot be UTF-8 in an ASCII line put in it."""
    good, _ = draw(generates.filter(lambda g: g[0].isascii()))
    at = draw(st.integers(0, len(good)))
    return good[:at] + bytes([draw(st.integers(0x80, 0xFF))]) + good[at:], "ERROR"


@st.composite
def too_long(draw: st.DrawFn) -> Line:
    n = MAX_LINE_BYTES + draw(st.sampled_from([1, 2, 100, 70_000]))
    head = b'{"cmd":"generate","id":1,"prompt":"' if draw(st.booleans()) else b""
    return head + b"\xff" * draw(st.integers(0, 3)) + b"x" * (n - len(head)), "ERROR"


surrogates = st.sampled_from(
    [(b'{"cmd":"generate","id":2,"prompt":"\\ud800"}', "ERROR"), (b'{"cmd":"generate","prompt":"a\\udfffb"}', "ERROR")]
)
byte_lines = st.one_of(answered, answered, junk.map(lambda b: (b, "ERROR")), not_utf8(), too_long(), surrogates)

ANSWERS = {"BMOE_ERROR", "BMOE_DONE", "BMOE_STATS", "BMOE_DECIDE"}


def test_random_bytes_are_answered_or_refused_line_by_line(tiny_models) -> None:
    s = Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=512, n_threads=1))

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        st.lists(byte_lines, min_size=1, max_size=12),
        st.sampled_from(["eof", "eof-no-newline", "close"]),
        st.booleans(),
    )
    def session_run(lines: list[Line], end: str, text_stdin: bool) -> None:
        if end == "close":
            lines = lines + [(b'{"cmd":"close"}', None), (b'{"cmd":"stats"}', None), (b"\xff", None)]  # not read
        data = b"\n".join(raw for raw, _ in lines) + (b"" if end == "eof-no-newline" else b"\n")
        stdin = (
            io.TextIOWrapper(io.BytesIO(data), encoding="utf-8") if text_stdin else io.BufferedReader(io.BytesIO(data))
        )
        out, rc = io.StringIO(), []
        t = threading.Thread(target=lambda: rc.append(run_session(s, stdin, out)), daemon=True)
        t.start()
        t.join(20)
        assert not t.is_alive(), f"the loop hung on {data[:300]!r}"
        assert rc == [0]
        got = []
        for ln in out.getvalue().splitlines():
            tag, _, body = ln.partition(" ")
            obj = json.loads(body)
            assert tag.startswith("BMOE_") and not (tag == "BMOE_ERROR" and obj["fatal"]), ln
            if tag in ANSWERS:
                got.append(tag[len("BMOE_") :])
        expected = [kind for _, kind in lines if kind is not None]
        assert got == expected, [raw[:80] for raw, _ in lines]

    t0 = time.perf_counter()
    try:
        session_run()
    finally:
        s.close()
    assert time.perf_counter() - t0 < 60
