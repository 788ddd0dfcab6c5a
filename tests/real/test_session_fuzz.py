"""Thousands of random and mutated request lines: the session never dies, and answers
a valid request afterwards exactly as a fresh session does."""
import io
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bmoe.cli.loop import run_session

VALID = {"cmd": "generate", "id": 7, "prompt": "Name a color.", "n_predict": 3}

scalars = st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=12)
values = st.recursive(scalars, lambda k: st.lists(k, max_size=3) | st.dictionaries(st.text(max_size=6), k, max_size=3), max_leaves=6)
fields = st.sampled_from(["cmd", "id", "prompt", "n_predict", "think", "clear_kv", "temperature", "seed",
                          "choices", "prefix", "suffix", "requests", "reuse_prefix", "abstain_below"])
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


lines = st.one_of(mutated(), st.text(max_size=40).filter(lambda s: "\n" not in s and "\r" not in s
                                                         and "close" not in s))


def answer_text(out: str, rid: int) -> str:
    for ln in out.splitlines():
        if ln.startswith("BMOE_DONE "):
            d = json.loads(ln[len("BMOE_DONE "):])
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
