"""The decider, through the service, over a scripted backend whose side sequences open late (decide_batch auto).

When the service has them opened: before the first request list that would use them (a
full-scored request, two first-token decisions keeping the same prefix, a debias's permutations),
before anything of that list touches the sequence, after dropping the kept prefix state; never
for one decision alone, never twice, never where none can be opened.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from bmoe.decide.port import SIDE_MEMORY, KeptState, PrefillCost, SideSequences
from bmoe.decide.service import DecideService
from bmoe.decide.types import DecideRequest, RenderRule
from helpers.decide import PREFIX, SUFFIX, ForkingBackend, decide_service, full


class LateBackend(ForkingBackend):
    """Side sequences that open on request: ``room`` of them (0: no memory); opening empties the
    sequence, as re-creating a llama context does."""

    def __init__(self, *, room: int = 3, **kw: object) -> None:
        super().__init__(forks=0, batch=1, **kw)
        self.room = room
        self.open = 0

    def forget(self) -> None:
        super().forget()
        self.calls.append(("forget", (), 0))

    def side_sequences(self) -> SideSequences:
        if self.open:
            return SideSequences(self.open, self.open)
        return SideSequences(0, self.room, "" if self.room else SIDE_MEMORY, kv_bytes=2**20, room_bytes=0)

    def open_side_sequences(self) -> int:
        self.calls.append(("open_side_sequences", (), self.room))
        assert not self.kept, "the kept state is dropped first"
        self.open = self.forks = self.batch = self.room
        self.pieces = []
        return self.open

    def max_forks(self) -> int:
        return self.open

    def max_batch(self) -> int:
        return max(1, self.open)

    def prefill_batch(
        self, suffixes: Sequence[Sequence[int]], n_past: int, stop: Callable[[], bool] = lambda: False
    ) -> tuple[list[np.ndarray], PrefillCost]:
        assert self.open, "a batch before the side sequences were opened"
        return super().prefill_batch(suffixes, n_past, stop)

    def prefill_forks(
        self, continuations: Sequence[Sequence[int]], n_past: int, base: KeptState | None = None
    ) -> tuple[list[np.ndarray], PrefillCost]:
        assert self.open, "forks before the side sequences were opened"
        return super().prefill_forks(continuations, n_past, base)


def plain(i: int, suffix: str = SUFFIX, prefix: str = PREFIX) -> DecideRequest:
    return DecideRequest(id=i, prefix=prefix, suffix=suffix, choices=("A", "B"))


def service(b: LateBackend, keep_prefix: bool = True) -> DecideService:
    return decide_service(b, keep_prefix=keep_prefix, pride_sample=2)


def opened_at(b: LateBackend) -> list[int]:
    return [i for i, c in enumerate(b.calls) if c[0] == "open_side_sequences"]


def test_one_decision_at_a_time_never_opens_them() -> None:
    b = LateBackend()
    s = service(b)
    for i in range(3):
        assert s.answer([plain(i, f" Screen {i}.")])[0].error is None
    assert s.answer([plain(9, " A."), plain(10, " B.", prefix="Other. ")])[0].error is None  # no shared prefix
    assert opened_at(b) == [] and b.open == 0


def test_the_first_batch_opens_them_before_touching_the_sequence_and_then_they_stay() -> None:
    b = LateBackend(room=3)
    s = service(b)
    s.answer([plain(1)])
    assert s.decider.store.kept is not None
    n = len(b.calls)
    got = s.answer([plain(2, " One."), plain(3, " Two."), plain(4, " Three.")])
    assert opened_at(b) == [n + 1] and b.calls[n][0] == "forget"  # dropped, then opened, then the batch
    assert [c[0] for c in b.calls[n + 2 :]][:2] == ["clear", "prefill"]  # the prefix prefilled again
    assert got[0].reuse == "stored" and all(r.batch is not None and r.batch.size == 3 for r in got)
    s.answer([plain(5, " Four."), plain(6, " Five.")])
    assert len(opened_at(b)) == 1


def test_full_scoring_opens_them_and_a_refused_one_does_not() -> None:
    b = LateBackend(room=2)
    s = service(b)
    bad = s.answer([full(best_by="max")])[0]
    assert bad.refused and opened_at(b) == []
    r = s.answer([full()])[0]
    assert r.error is None and [c[0] for c in b.calls][:2] == ["forget", "open_side_sequences"]
    assert r.scores.choice_tokens is not None


def test_without_room_batches_run_one_by_one_and_full_scoring_is_refused() -> None:
    b = LateBackend(room=0)
    s = service(b)
    got = s.answer([plain(1, " One."), plain(2, " Two.")])
    assert all(r.error is None and r.batch is None for r in got) and opened_at(b) == []
    r = s.answer([full()])[0]
    assert r.refused and "none fits in memory: one takes 1.0 MiB" in r.error


def test_without_the_prefix_cache_only_full_scoring_opens_them() -> None:
    b = LateBackend()
    s = service(b, keep_prefix=False)
    s.answer([plain(1, " One."), plain(2, " Two.")])
    assert opened_at(b) == []
    assert s.answer([full()])[0].error is None and len(opened_at(b)) == 1


def test_a_debiased_request_opens_them_for_its_permutations() -> None:
    b = LateBackend(room=4)
    s = service(b)
    one_line = RenderRule(template=" {question} {options}. {cue}", joiner=" ")  # the scripted vocabulary has no newline
    r = DecideRequest(
        id=1,
        prefix=PREFIX,
        suffix="",
        choices=(),
        question="Q",
        options=("x", "y", "z"),
        render=one_line,
        debias="permute",
    )
    got = s.answer([r])[0]
    assert got.error is None and got.debias.decisions == 3 and len(opened_at(b)) == 1
