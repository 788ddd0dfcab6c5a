"""The deltas of a generation's steps add up to its text, also where the text stream held a
piece back when the turn ended (a possible start of a think marker, an incomplete UTF-8
character): Runtime._run_turn over a scripted model, KV and sampler (no llama.cpp)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from bmoe.runtime.chat import Message
from bmoe.runtime.kv import KvPlan
from bmoe.runtime.reasoning import THINK
from bmoe.runtime.results import GenerateRequest, GenerateResult, Step
from bmoe.runtime.runtime import Runtime
from bmoe.runtime.turn import Turn
from bmoe.stream.stats import StreamStats

EOG = 0


class _Model:
    def __init__(self, pieces: dict[int, bytes]) -> None:
        self.pieces = pieces

    def is_eog(self, tok: int) -> bool:
        return tok == EOG

    def token_bytes(self, tok: int) -> bytes:
        return self.pieces[tok]

    def tokenize(self, text: str, **_: bool) -> list[int]:  # the markers hold no control token here
        return []


class _Kv:
    def __init__(self) -> None:
        self.n_past = 0

    def align(self, prompt, *, reuse: bool) -> KvPlan:  # noqa: ANN001
        return KvPlan(0, "")

    def append(self, toks) -> np.ndarray:  # noqa: ANN001
        self.n_past += len(toks)
        return np.zeros(4, dtype=np.float32)

    def rollback(self, n: int) -> None:
        self.n_past = n


class _Chat:
    think_ctl = "template"  # the turn says whether its prompt opened reasoning (Turn.opens_reasoning)
    reasoning = THINK  # its model reasons in <think> (runtime/reasoning.py)


class _Script:
    def __init__(self, toks: list[int]) -> None:
        self.toks = list(toks)

    def sample(self, logits: np.ndarray) -> int:
        return self.toks.pop(0)

    def taken(self, tok: int) -> None:  # the scripted tokens carry no penalties
        pass


class _Ctx:
    def __init__(self, n_ctx: int = 64) -> None:
        self.n_ctx, self.n_dev_tokens = n_ctx, 0


def _run(
    pieces: dict[int, bytes], script: list[int], n_predict: int, *, cancel_after: int | None = None, n_ctx: int = 64
) -> tuple[list[Step], GenerateResult]:
    rt = object.__new__(Runtime)
    rt.model, rt.kv, rt.chat, rt.ctx = _Model(pieces), _Kv(), _Chat(), _Ctx(n_ctx)
    rt.load_s, rt.prefill_device, rt.history, rt.stream = 0.0, None, [], None
    turn = Turn(GenerateRequest(prompt="p"), [Message("user", "p")], [1, 2, 3], n_predict, _Script(script), "", True)
    cancel = threading.Event()
    it = rt.run(turn, cancel)
    steps: list[Step] = []
    while True:
        try:
            steps.append(next(it))
        except StopIteration as done:
            return steps, done.value
        if cancel_after is not None and len(steps) == cancel_after:
            cancel.set()


PIECES = {1: b"ok ", 2: b"a <", 3: b"\xe2\x82", 4: b"\xac!", 5: b"think>x"}


@pytest.mark.parametrize(
    ("script", "n_predict", "text", "extra"),
    [
        ([1, 2, EOG], 8, "ok a <", True),  # "<" may open "<think>": held back until the end
        ([1, 3, EOG], 8, "ok \ufffd", True),  # half a character when the turn ends
        ([1, 3, 4, EOG], 8, "ok \u20ac!", False),  # the next token completes it: nothing is left
        ([1, 2], 2, "ok a <", False),  # n_predict: the last token's step carries the tail
        ([2, 5, EOG], 8, "a ", False),  # the marker completes: "x" is reasoning
    ],
)
def test_the_steps_deltas_add_up_to_the_text(script, n_predict, text, extra) -> None:
    steps, r = _run(PIECES, script, n_predict)
    assert r.text == text
    assert "".join(s.delta_text for s in steps) == r.text
    assert "".join(s.delta_reasoning for s in steps) == r.reasoning
    n_tokens = len([t for t in script if t != EOG][:n_predict])
    assert len(steps) == n_tokens + (1 if extra else 0)  # one more step only where something was held back
    assert [s.index for s in steps] == list(range(len(steps)))


def test_a_cancelled_turn_sends_what_was_held_back_too() -> None:
    steps, r = _run(PIECES, [1, 2, 1], 8, cancel_after=2)
    assert r.cancelled and r.text == "ok a <"
    assert "".join(s.delta_text for s in steps) == r.text and len(steps) == 3


def test_the_context_limit_ends_the_turn_with_its_last_token_and_the_tail() -> None:
    # 3 prompt tokens + 2 generated fill the KV; a third is chosen from the last logits, and ends it
    steps, r = _run(PIECES, [1, 1, 2, 1], 8, n_ctx=5)
    assert r.stop == "ctx" and r.tokens == (1, 1, 2)
    assert [s.delta_text for s in steps] == ["ok ", "ok ", "a <"]


def test_a_generate_cancelled_before_it_starts_keeps_the_cache_gauges() -> None:
    rt = object.__new__(Runtime)
    rt.kv, rt.ctx, rt.load_s, rt.prefill_device = _Kv(), _Ctx(), 0.0, None
    stats = StreamStats(hits=5, misses=7, resident_bytes=3 << 20, budget_bytes=8 << 20)
    rt.stream_stats = lambda: stats  # type: ignore[method-assign]
    turn = Turn(GenerateRequest(prompt="p"), [], [1], 4, _Script([]), "", False)
    cancel = threading.Event()
    cancel.set()
    it = rt.run(turn, cancel)
    with pytest.raises(StopIteration) as done:
        next(it)
    r: GenerateResult = done.value.value
    assert r.cancelled and r.tokens == ()
    assert (r.io.hits, r.io.misses, r.io.resident_bytes, r.io.budget_bytes) == (0, 0, 3 << 20, 8 << 20)
    assert r.io.hit_pct == 0.0  # a cache, nothing looked up: not the -1 of "no cache"
