"""KvSequence.guard: whoever still needs the first n tokens' state hears before any of them goes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from bmoe.runtime.kv import KvSequence


class FakeContext:
    """Records what the KV bookkeeping asks of the context; trims fail like recurrent memory
    when ``cuttable`` is False."""

    def __init__(self, cuttable: bool = True) -> None:
        self.cuttable = cuttable
        self.ops: list[str] = []

    def clear(self) -> None:
        self.ops.append("clear")

    def trim(self, n_keep: int) -> bool:
        self.ops.append(f"trim {n_keep}")
        return self.cuttable

    def decode(self, tokens: Sequence[int], n_past: int, logits: str = "last") -> np.ndarray:
        self.ops.append(f"decode {n_past}+{len(tokens)}")
        return np.zeros(4, dtype=np.float32)


def guarded(n_tokens: int = 10, n_guard: int = 6) -> tuple[KvSequence, FakeContext, list[list[int]]]:
    ctx = FakeContext()
    kv = KvSequence(ctx)  # type: ignore[arg-type]
    kv.append(list(range(n_tokens)))
    saved: list[list[int]] = []
    kv.guard(n_guard, lambda: saved.append(list(kv.tokens)))
    ctx.ops.clear()
    return kv, ctx, saved


def test_appending_and_trimming_above_the_guard_save_nothing() -> None:
    kv, ctx, saved = guarded()
    kv.append([10, 11])
    kv.rollback(6)
    plan = kv.align(list(range(6)) + [99, 98])
    assert plan.n_reused == 6 and saved == []


@pytest.mark.parametrize(
    "cut",
    [
        lambda kv: kv.reset(),
        lambda kv: kv.rollback(3),
        lambda kv: kv.align([0, 1, 2, 77, 78]),
        lambda kv: kv.align(list(range(10)), reuse=False),
    ],
    ids=["reset", "rollback", "align", "align-no-reuse"],
)
def test_cutting_into_the_guarded_tokens_saves_first_and_once(cut) -> None:
    kv, ctx, saved = guarded()
    cut(kv)
    assert saved == [list(range(10))]  # called while the sequence still held every token
    ctx.ops.clear()
    kv.reset()
    assert saved == [list(range(10))] and ctx.ops == ["clear"]  # fired once, then gone


def test_unguard_and_replacing_the_guard() -> None:
    kv, ctx, saved = guarded()
    kv.unguard()
    kv.reset()
    assert saved == []
    kv.append([1, 2, 3])
    kv.guard(2, lambda: saved.append(["first"]))
    kv.guard(3, lambda: saved.append(["second"]))
    kv.rollback(2)
    assert saved == [["second"]]


def test_a_failed_decode_saves_before_the_reset() -> None:
    kv, ctx, saved = guarded()

    def boom(*_a, **_k):
        raise RuntimeError("decode failed")

    ctx.decode = boom  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        kv.append([5])
    assert saved == [list(range(10))] and kv.tokens == []


class PieceContext(FakeContext):
    """Holds ``positions`` the way llama.cpp's memory does: decode() feeds n_batch tokens per
    llama_decode, and a failing piece leaves the pieces before it in the KV."""

    def __init__(self, n_batch: int, fail_at_piece: int, exc: BaseException) -> None:
        super().__init__()
        self.n_batch, self.fail_at_piece, self.exc = n_batch, fail_at_piece, exc
        self.positions = 0

    def clear(self) -> None:
        super().clear()
        self.positions = 0

    def trim(self, n_keep: int) -> bool:
        super().trim(n_keep)
        self.positions = min(self.positions, n_keep)
        return True

    def decode(self, tokens: Sequence[int], n_past: int, logits: str = "last") -> np.ndarray:
        for piece, at in enumerate(range(0, len(tokens), self.n_batch)):
            if piece == self.fail_at_piece:
                raise self.exc
            self.positions = n_past + min(at + self.n_batch, len(tokens))
        return np.zeros(4, dtype=np.float32)


@pytest.mark.parametrize("exc", [RuntimeError("llama_decode failed"), KeyboardInterrupt()], ids=["error", "interrupt"])
def test_a_decode_failing_part_way_is_cut_back_before_the_guard_saves(exc: BaseException) -> None:
    """Pieces 0 and 1 of 3 went in, piece 2 failed: the guard's save must see the sequence
    holding exactly the n_past tokens the bookkeeping knows (before: 10 + 8 positions, which the
    kept prefix state then carried). A KeyboardInterrupt is handled the same (before: it skipped
    the reset, leaving the bookkeeping 10 tokens behind what the KV held)."""
    ctx = PieceContext(n_batch=4, fail_at_piece=2, exc=exc)
    kv = KvSequence(ctx)  # type: ignore[arg-type]
    ctx.fail_at_piece = -1
    kv.append(list(range(10)))
    ctx.fail_at_piece = 2
    seen: list[int] = []
    kv.guard(10, lambda: seen.append(ctx.positions))
    with pytest.raises(type(exc)):
        kv.append(list(range(100, 112)))
    assert seen == [10]  # saved while the sequence held the 10 known tokens and nothing after them
    assert kv.tokens == [] and ctx.positions == 0


def test_an_empty_prompt_is_refused_before_the_kv_changes() -> None:
    """An empty token list (an empty prompt, no template, no BOS) once trimmed to n = -1,
    dropping the bookkeeping's last token while llama.cpp dropped every position."""
    from bmoe.errors import RequestError

    kv, ctx, saved = guarded()
    with pytest.raises(RequestError, match=r"^prompt: has no tokens; a prompt needs at least one$"):
        kv.align([])
    assert kv.tokens == list(range(10)) and ctx.ops == [] and saved == []
