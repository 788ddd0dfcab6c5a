"""KvCache.guard: whoever still needs the first n tokens' state hears before any of them goes."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from bmoe.runtime.kv import KvCache


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


def guarded(n_tokens: int = 10, n_guard: int = 6) -> tuple[KvCache, FakeContext, list[list[int]]]:
    ctx = FakeContext()
    kv = KvCache(ctx)  # type: ignore[arg-type]
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
