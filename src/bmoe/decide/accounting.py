"""What a decision cost, as its result says: the prompt's prefill calls (a batch member's share of
its call), the kept state's restore and store, and full scoring's calls (docs/decide.md, the
BMOE_DECIDE keys)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from bmoe.decide.checks import Tokenized
from bmoe.decide.port import PrefillCost
from bmoe.decide.types import BatchShare, ChoiceScores, DecideRequest, DecideResult


@dataclass(frozen=True, slots=True)
class Prefilled:
    """How the prompt got into the sequence."""

    costs: tuple[PrefillCost, ...]
    n_reused: int
    restore_s: float
    store_s: float
    reuse: str
    tier: str = ""  # where a restored state came from (kept_prefix.TIER_*); "" when none was


@dataclass(frozen=True, slots=True)
class Scored:
    """What scoring the choices cost beyond the prompt (scoring "full" only)."""

    costs: tuple[PrefillCost, ...] = ()
    uncond_reuse: str | None = None
    uncond_state_mib: float | None = None


def share_of(cost: PrefillCost, n_tokens: int) -> PrefillCost:
    """A batch member's share of its call ``cost``: ``n_tokens`` of the call's tokens."""
    part = n_tokens / max(1, cost.n_tokens)
    return PrefillCost(
        n_tokens=n_tokens,
        prefill_s=cost.prefill_s * part,
        read_mb=None if cost.read_mb is None else cost.read_mb * part,
        cache_hits=None if cost.cache_hits is None else cost.cache_hits * part,
        cache_misses=None if cost.cache_misses is None else cost.cache_misses * part,
        prefill_dev_tokens=None if cost.prefill_dev_tokens is None else round(cost.prefill_dev_tokens * part),
    )


def result(
    request: DecideRequest,
    tok: Tokenized,
    done: Prefilled,
    scores: ChoiceScores,
    held_mib: float,
    batch: BatchShare | None = None,
    scored: Scored = Scored(),
) -> DecideResult:
    prefill_s = sum(c.prefill_s for c in done.costs)
    n_prefilled = tok.prompt.n_tokens - done.n_reused
    return DecideResult(
        id=request.id,
        scores=scores,
        n_tokens=tok.prompt.n_tokens,
        n_reused=done.n_reused,
        prefill_s=prefill_s,
        prefill_tps=n_prefilled / prefill_s if prefill_s > 0 else 0.0,
        read_mb=_sum_or_none([c.read_mb for c in done.costs]),
        cache_hit_pct=_hit_pct(done.costs),
        prefill_dev_tokens=_sum_or_none([c.prefill_dev_tokens for c in done.costs]),
        prefix_state_mib=held_mib,
        store_s=done.store_s,
        restore_s=done.restore_s,
        reuse=done.reuse,
        reuse_tier=done.tier,
        batch=batch,
        score_tokens=sum(c.n_tokens for c in scored.costs),
        score_s=sum(c.prefill_s for c in scored.costs),
        score_read_mb=_sum_or_none([c.read_mb for c in scored.costs]),
        uncond_reuse=scored.uncond_reuse,
        uncond_state_mib=scored.uncond_state_mib,
    )


def _hit_pct(costs: Sequence[PrefillCost]) -> float | None:
    """The expert cache hit rate over a request's calls, in percent, by BMOE_DONE's rule: None
    when no experts are streamed, -1 with the expert cache off, 0 when nothing was looked up."""
    if all(c.read_mb is None for c in costs):
        return None
    counted = [(c.cache_hits, c.cache_misses or 0.0) for c in costs if c.cache_hits is not None]
    if not counted:
        return -1.0
    hits = sum(h for h, _ in counted)
    looked = hits + sum(m for _, m in counted)
    return 100.0 * hits / looked if looked else 0.0


_N = TypeVar("_N", int, float)


def _sum_or_none(values: Sequence[_N | None]) -> _N | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None
