"""The session protocol's kept keys (the C++ original's, which its consumers parse): every kept
key of each line, in the original's order, before bmoe's own keys. A rename, a drop or a
reorder of a kept key fails here. The lists are the protocol's, written out (docs/telemetry.md)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from bmoe.runtime.results import GenerateResult, Step
from bmoe.stream.stats import StreamStats
from bmoe.wire import records

KEPT = {
    "READY": ["load_s", "arch", "n_ctx", "think_ctl", "n_expert_used"],
    "BEGIN": ["id"],
    "LOAD": ["mb", "ms"],
    "PROGRESS": [
        "step",
        "steps",
        "wall_ms",
        "io_ms",
        "compute_ms",
        "mgmt_ms",
        "stall_ms",
        "read_mb",
        "cache_hit_pct",
        "majflt",
        "cpu_ms",
        "dense_resident_frac",
        "delta_text",
        "delta_reasoning",
    ],
    "DONE": [
        "id",
        "cancelled",
        "tokens",
        "tok_s",
        "prefill_s",
        "prefill_tps",
        "load_s",
        "cache_hit_pct",
        "n_prompt",
        "n_past",
        "compute_s_tok",
        "io_s_tok",
        "cache_resident_mib",
        "cache_budget_mib",
        "read_mib",
        "stall_s_tok",
        "mgmt_s_tok",
        "majflt_tok",
        "cpu_s_tok",
        "reasoning",
        "text",
    ],
    "ERROR": ["id", "fatal", "msg"],
}

STEP = Step(
    index=0,
    token=5,
    delta_text="a",
    delta_reasoning="",
    wall_ms=10.0,
    io_ms=4.0,
    mgmt_ms=1.0,
    stall_ms=2.0,
    compute_ms=5.0,
    read_mb=3.0,
    cache_hit_pct=50.0,
    majflt=0,
    cpu_ms=9.0,
)
RESULT = GenerateResult(
    id=1,
    text="a",
    reasoning="",
    tokens=(5,),
    cancelled=False,
    stop="length",
    n_prompt=3,
    n_reused=0,
    n_past=4,
    prefill_fallback="",
    prefill_s=0.1,
    decode_s=0.01,
    load_s=1.0,
    io=StreamStats(read_bytes=3 << 20, io_s=0.004),
    majflt=0,
    cpu_s=0.01,
    decode_io=StreamStats(read_bytes=3 << 20, io_s=0.004),
)


def _keys(text: str) -> tuple[str, list[str]]:
    tag, _, body = text.partition(" ")
    return tag.removeprefix("BMOE_"), list(json.loads(body))


def test_every_line_starts_with_its_kept_keys_in_order() -> None:
    lines = [
        records.ready(
            load_s=1.0,
            arch="qwen3moe",
            n_ctx=256,
            think_ctl="none",
            n_expert_used=8,
            model="m",
            streaming=True,
            decide=False,
            load_read_mib=1.0,
        ),
        records.begin(1),
        records.load(STEP),
        records.progress(STEP, 8, 1.0),
        records.done(RESULT),
        records.error(1, "bad", fatal=False),
    ]
    seen = dict(_keys(ln) for ln in lines)
    assert set(seen) == set(KEPT)
    for tag, kept in KEPT.items():
        assert seen[tag][: len(kept)] == kept, tag


def test_a_token_whose_experts_were_read_sends_load_then_progress() -> None:
    tags = [_keys(ln)[0] for ln in records.step_lines(STEP, 8, 1.0)]
    assert tags == ["LOAD", "PROGRESS"]
    resident = Step(**{**{f: getattr(STEP, f) for f in STEP.__slots__}, "read_mb": 0.0})
    assert [_keys(ln)[0] for ln in records.step_lines(resident, 8, 1.0)] == ["PROGRESS"]


class _OneShotSession:
    """Enough of a Session for run_oneshot: one token, then RESULT."""

    config = SimpleNamespace(n_predict=8)

    def dense_resident_frac(self) -> float:
        return 1.0

    def generate(self, req, on_step):  # noqa: ANN001
        on_step(STEP)
        return RESULT


def _one_shot(**kw: bool) -> tuple[str, str]:
    import io

    from bmoe.cli.oneshot import run_oneshot

    out, err = io.StringIO(), io.StringIO()
    assert run_oneshot(_OneShotSession(), "hi", out=out, err=err, **kw) == 0  # type: ignore[arg-type]
    return out.getvalue(), err.getvalue()


def _tags(text: str) -> list[str]:
    return [ln.split(" ", 1)[0] for ln in text.splitlines() if ln.startswith("BMOE_")]


def test_one_shot_stdout_is_the_answer_alone_and_stderr_the_rest() -> None:
    out, err = _one_shot(progress=False)
    assert out == RESULT.text + "\n"
    assert _tags(err) == ["BMOE_DONE"] and err.endswith(records.done(RESULT) + "\n")
    assert err.startswith("\n" + records.summary(RESULT) + "\n")


def test_one_shot_progress_sends_load_lines_too() -> None:
    out, err = _one_shot(progress=True)
    assert out == RESULT.text + "\n"
    assert _tags(err) == ["BMOE_LOAD", "BMOE_PROGRESS", "BMOE_DONE"]


def test_one_shot_json_is_one_line_the_done_object() -> None:
    for progress in (False, True):
        out, err = _one_shot(progress=progress, as_json=True)
        assert out.count("\n") == 1 and out.endswith("\n")
        assert json.loads(out) == json.loads(records.done(RESULT).removeprefix("BMOE_DONE "))
        assert json.loads(out)["text"] == RESULT.text
        assert _tags(err) == (["BMOE_LOAD", "BMOE_PROGRESS"] if progress else [])
        assert records.summary(RESULT) in err
