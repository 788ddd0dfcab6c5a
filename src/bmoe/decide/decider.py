"""One decision start to finish: checks, prefix split, restore or clear, prefill, store, score.

Sequencing rule (what makes a restored prefix exact): with the prefix cache on, a prompt is always
prefilled as [prefix piece][rest piece], whether or not a state was restored. A fresh decision and
one that restored the same prefix therefore run the same rest-piece graph over the same state, and
their logits agree bit for bit. Without the cache (off, opted out) the prompt is prefilled whole,
as one piece, which is what perplexity() over the same text computes.

Batches (``answer_checked`` over a backend whose ``max_batch()`` is above 1): decisions that keep the
same prefix share one prefix piece, and their rest pieces go into one ``prefill_batch`` call, each
on its own copy of the prefix state. Each rest piece is the same piece the decision would prefill
alone after its restored prefix.

Full scoring (``scoring="full"``, docs/decide.md "Scoring modes"): after the prompt is in the
sequence, every choice's tokens are prefilled on their own forked copies of it (``continuations``);
the sequence and the kept prefix state are exactly as after a first-token decision. Such a
request is not batched with others: its choices already fill the side sequences.

Both need side sequences open before they run: ``wants_side_sequences`` says whether a checked
request list would use them, and the service opens them (``DecideBackend.open_side_sequences``)
before anything of the list is prefilled.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar, Union

import numpy as np

from bmoe.decide.choice_scorer import check_prompt_fits, first_tokens, score_choices, tokenize_choices
from bmoe.decide.continuations import NeutralStore, continuation_logps
from bmoe.decide.errors import (
    DecideBackendError,
    DecideCancelled,
    DecideRefusal,
    DecideRequestError,
    NoSideSequenceError,
)
from bmoe.decide.kept_prefix import PrefixStore
from bmoe.decide.port import (
    BYTES_PER_MIB,
    SIDE_FAILED,
    SIDE_MEMORY,
    DecideBackend,
    PrefillCost,
    SideSequences,
    is_image_token,
)
from bmoe.decide.prompt_split import SplitPrompt, split_prompt
from bmoe.decide.scoring_modes import (
    SCORING_FULL,
    check_choices_fit,
    check_scoring_fields,
    full_scores,
    neutral_text,
)
from bmoe.decide.types import BatchShare, ChoiceScores, DecideRequest, DecideResult, check_abstain_below
from bmoe.numerics import log_softmax

# What happened to the kept prefix state, as BMOE_DECIDE's "reuse" says it.
REUSE_RESTORED = "restored"  # the kept state was exactly this prefix: restored, nothing stored
REUSE_RESTORED_STORED = "restored+stored"  # kept state extended: restored, longer prefix stored
REUSE_STORED = "stored"  # nothing was kept: prefix prefilled and stored
REUSE_MISS = "miss: prefix differs at token {n}"  # kept state unusable: replaced by this prefix
REUSE_OFF = "off"  # the session keeps no prefix state; prefilled whole
REUSE_OPTED_OUT = "opted out"  # reuse_prefix false: prefilled whole, kept state left as it was
REUSE_NO_PREFIX = "no prefix"  # the prefix is empty on tokens: prefilled whole, kept state left


@dataclass(frozen=True, slots=True)
class DecidePolicy:
    """Session-wide decide settings, resolved at startup."""

    keep_prefix: bool  # from resolve_keep_prefix()


@dataclass(frozen=True, slots=True)
class _Tokenized:
    """A request that passed every check, as tokens (its prompt split at the prefix, its choices);
    nothing has touched the backend's sequence yet."""

    prompt: SplitPrompt
    first: tuple[int, ...]  # [n_choices] first token of each choice
    tokens: tuple[tuple[int, ...], ...] | None = None  # scoring "full": every token of each choice
    neutral: tuple[int, ...] | None = None  # scoring "full" with a neutral prompt: its tokens


@dataclass(frozen=True, slots=True)
class _Scored:
    """What scoring the choices cost beyond the prompt (scoring "full" only)."""

    costs: tuple[PrefillCost, ...] = ()
    uncond_reuse: str | None = None
    uncond_state_mib: float | None = None


@dataclass(frozen=True, slots=True)
class _Prefilled:
    """How the prompt got into the sequence."""

    costs: tuple[PrefillCost, ...]
    n_reused: int
    restore_s: float
    store_s: float
    reuse: str


Checked = Union[_Tokenized, DecideResult]  # a request that passed its checks, or its refusal


def check_requests(backend: DecideBackend, requests: Sequence[DecideRequest]) -> list[Checked]:
    """Every check that can refuse each request, in order; touches no model state. A refused
    request (or one whose prompt the backend failed to render or tokenize) comes back as its
    failed result, the others tokenized, for ``answer_checked``."""
    out: list[Checked] = []
    for request in requests:
        try:
            out.append(_tokenize(backend, request))
        except DecideRefusal as exc:
            out.append(DecideResult.failed(request.id, str(exc), exc))
        except Exception as exc:  # a backend failure while rendering or tokenizing
            out.append(DecideResult.failed(request.id, failure_message("preparing the prompt", exc), exc))
    return out


def _shares_prefix(request: DecideRequest, tok: _Tokenized) -> bool:
    """Whether the request can share its prefix piece with others: a first-token decision that
    keeps a non-empty prefix."""
    # A suffix holding an image runs alone: an image is prefilled by itself, not beside others.
    return bool(
        request.reuse_prefix
        and tok.prompt.n_prefix
        and tok.tokens is None
        and not any(is_image_token(t) for t in tok.prompt.tokens[tok.prompt.n_prefix :])
    )


def wants_side_sequences(requests: Sequence[DecideRequest], checked: Sequence[Checked], policy: DecidePolicy) -> bool:
    """Whether answering ``checked`` (``check_requests``'s answer for ``requests``) would use side
    sequences: a full-scored request (its choices are scored on them), or, with the prefix cache
    on, two first-token decisions that keep the same prefix (a batch)."""
    seen: set[tuple[int, ...]] = set()
    for request, tok in zip(requests, checked):
        if isinstance(tok, DecideResult):
            continue
        if tok.tokens is not None:
            return True
        if policy.keep_prefix and _shares_prefix(request, tok):
            if tok.prompt.prefix_tokens in seen:
                return True
            seen.add(tok.prompt.prefix_tokens)
    return False


def _run_tokenized(
    backend: DecideBackend,
    store: PrefixStore,
    request: DecideRequest,
    policy: DecidePolicy,
    tok: _Tokenized,
    neutral: NeutralStore | None = None,
) -> DecideResult:
    try:
        done = _prefill(backend, store, request, policy, tok.prompt)
        row = backend.last_logits()
    except Exception as exc:
        return DecideResult.failed(request.id, failure_message("running the prompt", exc), exc)
    try:
        if tok.tokens is None:
            scores, scored = score_choices(row, tok.first, request.abstain_below), _Scored()
        else:
            scores, scored = _score_full(backend, neutral or NeutralStore(), request, tok, row)
    except Exception as exc:
        return DecideResult.failed(request.id, failure_message("scoring the choices", exc), exc)
    return _result(request, tok, done, scores, backend.held_bytes / BYTES_PER_MIB, scored=scored)


def _score_full(
    backend: DecideBackend, neutral: NeutralStore, request: DecideRequest, tok: _Tokenized, row: np.ndarray
) -> tuple[ChoiceScores, _Scored]:
    """Every token of every choice after the prompt (the sequence holds it, ``row`` is its last
    logits), and after the neutral prompt when the request wants that."""
    assert tok.tokens is not None
    per_token, costs = continuation_logps(backend, row, tok.tokens, tok.prompt.n_tokens)
    per_token_neutral = None
    how = None
    if tok.neutral is not None:
        per_token_neutral, more, how = neutral.logps(backend, tok.neutral, tok.tokens)
        costs = costs + more
    scores = full_scores(
        request.choices,
        tok.first,
        log_softmax(row),
        per_token,
        request.best_by,
        request.abstain_below,
        per_token_neutral,
    )
    return scores, _Scored(
        costs=tuple(costs), uncond_reuse=how, uncond_state_mib=None if how is None else neutral.kept_mib
    )


def _result(
    request: DecideRequest,
    tok: _Tokenized,
    done: "_Prefilled",
    scores: ChoiceScores,
    held_mib: float,
    batch: BatchShare | None = None,
    scored: _Scored = _Scored(),
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
        batch=batch,
        score_tokens=sum(c.n_tokens for c in scored.costs),
        score_s=sum(c.prefill_s for c in scored.costs),
        score_read_mb=_sum_or_none([c.read_mb for c in scored.costs]),
        uncond_reuse=scored.uncond_reuse,
        uncond_state_mib=scored.uncond_state_mib,
    )


def answer_checked(
    backend: DecideBackend,
    store: PrefixStore,
    requests: Sequence[DecideRequest],
    checked: Sequence[Checked],
    policy: DecidePolicy,
    neutral: NeutralStore | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> list[DecideResult]:
    """Run requests already checked (``check_requests``), each as if answered alone in order.

    ``stop`` is asked before each decision or batch runs, and by the backend between the calls of
    a batch: once it says so, every decision not answered yet is a ``DecideCancelled`` failure
    (a client that left, ``Session.cancel()``).

    A refused one is answered at once and spoils nothing. With a backend that batches
    (``max_batch() > 1``) and the prefix cache on, the requests that keep a prefix are grouped by
    it, and each group's rest pieces are prefilled together, at most ``max_batch()`` per call.
    Groups run in the order of their last request, so the state kept at the end is the one the
    last request would have left. Results come back in request order. Full-scored requests run
    alone (their choices take the side sequences)."""
    neutral = neutral or NeutralStore()
    cap = backend.max_batch() if policy.keep_prefix and len(requests) > 1 else 1
    results: list[DecideResult | None] = [None] * len(requests)
    units: dict[object, list[tuple[int, _Tokenized]]] = {}
    for i, (request, tok) in enumerate(zip(requests, checked)):
        if isinstance(tok, DecideResult):
            results[i] = tok
            continue
        # Only first-token decisions that keep a prefix can share one; the others run alone, in order.
        key: object = tok.prompt.prefix_tokens if cap > 1 and _shares_prefix(request, tok) else ("alone", i)
        units.setdefault(key, []).append((i, tok))
    for members in sorted(units.values(), key=lambda m: m[-1][0]):
        if len(members) == 1:
            i, tok = members[0]
            results[i] = (
                _cancelled(requests[i]) if stop() else _run_tokenized(backend, store, requests[i], policy, tok, neutral)
            )
            continue
        for start in range(0, len(members), cap):
            chunk = members[start : start + cap]
            answered = (
                [_cancelled(requests[i]) for i, _ in chunk]
                if stop()
                else _run_batch(backend, store, requests, chunk, stop)
            )
            for i, result in zip((i for i, _ in chunk), answered):
                results[i] = result
    return [r for r in results if r is not None]


def _cancelled(request: DecideRequest) -> DecideResult:
    exc = DecideCancelled("decide: cancelled before this decision ran (the request was cancelled)")
    return DecideResult.failed(request.id, str(exc), exc)


_batch_ids = itertools.count(1)  # BatchShare.id: batches prefilled in this process


def _run_batch(
    backend: DecideBackend,
    store: PrefixStore,
    requests: Sequence[DecideRequest],
    members: list[tuple[int, _Tokenized]],
    stop: Callable[[], bool] = lambda: False,
) -> list[DecideResult]:
    """Prefill the members' rest pieces together after their shared prefix (kept, restored or
    computed and stored, as ``_prefill`` does for one decision)."""
    first = members[0][1].prompt
    try:
        head = _prefix_piece(backend, store, first)
        n_prefix = first.n_prefix
        rows, cost = backend.prefill_batch([tok.prompt.tokens[n_prefix:] for _, tok in members], n_prefix, stop=stop)
    except DecideCancelled:
        return [_cancelled(requests[i]) for i, _ in members]
    except Exception as exc:
        msg = failure_message("running the prompt", exc)
        return [DecideResult.failed(requests[i].id, msg, exc) for i, _ in members]
    share = BatchShare(
        id=next(_batch_ids), size=len(members), n_tokens=cost.n_tokens, prefill_s=cost.prefill_s, read_mb=cost.read_mb
    )
    out: list[DecideResult] = []
    for k, ((i, tok), row) in enumerate(zip(members, rows)):
        request = requests[i]
        part = (tok.prompt.n_tokens - n_prefix) / max(1, cost.n_tokens)
        mine = PrefillCost(
            n_tokens=tok.prompt.n_tokens - n_prefix,
            prefill_s=cost.prefill_s * part,
            read_mb=None if cost.read_mb is None else cost.read_mb * part,
            cache_hits=None if cost.cache_hits is None else cost.cache_hits * part,
            cache_misses=None if cost.cache_misses is None else cost.cache_misses * part,
            prefill_dev_tokens=None if cost.prefill_dev_tokens is None else round(cost.prefill_dev_tokens * part),
        )
        # The first member pays for the prefix piece, as it would alone; the others find it kept.
        done = (
            _Prefilled(
                costs=head.costs + (mine,),
                n_reused=head.n_reused,
                restore_s=head.restore_s,
                store_s=head.store_s,
                reuse=head.reuse,
            )
            if k == 0
            else _Prefilled(costs=(mine,), n_reused=n_prefix, restore_s=0.0, store_s=0.0, reuse=REUSE_RESTORED)
        )
        try:
            scores = score_choices(row, tok.first, request.abstain_below)
        except Exception as exc:
            out.append(DecideResult.failed(request.id, failure_message("scoring", exc), exc))
            continue
        out.append(_result(request, tok, done, scores, backend.held_bytes / BYTES_PER_MIB, batch=share))
    return out


def _tokenize(backend: DecideBackend, request: DecideRequest) -> _Tokenized:
    """Every check that can refuse the request; touches no model state."""
    check_abstain_below(request.abstain_below)
    check_scoring_fields(request)
    if request.scoring == SCORING_FULL:
        return _tokenize_full(backend, request)
    first = first_tokens(backend, request.choices)
    prompt = split_prompt(backend, request.prefix, request.suffix, request.images)
    check_prompt_fits(prompt.n_tokens, backend.n_ctx(), sum(1 for t in prompt.tokens if is_image_token(t)))
    return _Tokenized(prompt=prompt, first=first)


def _tokenize_full(backend: DecideBackend, request: DecideRequest) -> _Tokenized:
    """The checks of a full-scored request: every choice's tokens fit after the prompt (and after
    the neutral prompt), on side sequences the backend has."""
    tokens = tokenize_choices(backend, request.choices)  # first tokens may collide: all are scored
    prompt = split_prompt(backend, request.prefix, request.suffix, request.images)
    n_ctx = backend.n_ctx()
    check_prompt_fits(prompt.n_tokens, n_ctx, sum(1 for t in prompt.tokens if is_image_token(t)))
    sides = backend.side_sequences()  # open or to be opened before the request runs (the service)
    if sides.n_most < 1:
        raise NoSideSequenceError(no_side_sequence_message(sides, n_ctx))
    check_choices_fit(request.choices, tokens, prompt.n_tokens, n_ctx)
    neutral: tuple[int, ...] | None = None
    text = neutral_text(request)
    if text is not None:
        neutral = tuple(backend.tokenize_prompts([backend.render_user(text)])[0])
        if not neutral:
            raise DecideRequestError(
                'decide: the unconditional prompt renders to no tokens; give "unconditional" a neutral '
                'text, e.g. "Answer:"',
                field="unconditional",
            )
        check_choices_fit(request.choices, tokens, len(neutral), n_ctx, before="unconditional prompt")
    return _Tokenized(prompt=prompt, first=tuple(t[0] for t in tokens), tokens=tokens, neutral=neutral)


def no_side_sequence_message(sides: SideSequences, n_ctx: int) -> str:
    """The refusal of full scoring where the backend has no side sequence and will open none."""
    head = 'decide: "scoring": "full" scores each choice on a side sequence'
    if sides.why_none == SIDE_MEMORY:
        return (
            f"{head} and none fits in memory: one takes {sides.kv_bytes / BYTES_PER_MIB:.1f} MiB (the KV of a "
            f"{n_ctx}-token sequence) and half of what this process may still allocate is "
            f"{sides.room_bytes / BYTES_PER_MIB:.1f} MiB; free memory, or open the session with a smaller "
            "--ctx-size"
        )
    if sides.why_none == SIDE_FAILED:
        return f"{head} and opening them failed: {sides.detail}"
    return (
        f"{head} and this session has none (--decide-batch 1): open it with --decide-batch auto (the "
        "default) or 2 or more (SessionConfig.decide_batch)"
    )


def _prefill(
    backend: DecideBackend,
    store: PrefixStore,
    request: DecideRequest,
    policy: DecidePolicy,
    prompt: SplitPrompt,
) -> _Prefilled:
    tokens = prompt.tokens
    if not policy.keep_prefix or not request.reuse_prefix or prompt.n_prefix == 0:
        reuse = (
            REUSE_OFF if not policy.keep_prefix else REUSE_OPTED_OUT if not request.reuse_prefix else REUSE_NO_PREFIX
        )
        store_s = backend.clear()  # a kept state still in the sequence is copied out first
        cost = backend.prefill(tokens, 0)
        return _Prefilled(costs=(cost,), n_reused=0, restore_s=0.0, store_s=store_s, reuse=reuse)

    head = _prefix_piece(backend, store, prompt)
    costs = list(head.costs)
    costs.append(backend.prefill(tokens[prompt.n_prefix :], prompt.n_prefix))
    return _Prefilled(
        costs=tuple(costs), n_reused=head.n_reused, restore_s=head.restore_s, store_s=head.store_s, reuse=head.reuse
    )


def _prefix_piece(backend: DecideBackend, store: PrefixStore, prompt: SplitPrompt) -> _Prefilled:
    """Bring the sequence to exactly the prompt's prefix: the kept state restored, extended or
    replaced (then stored). ``costs`` holds the prefix piece's prefill when one ran."""
    tokens = prompt.tokens
    n_prefix = prompt.n_prefix
    lookup = store.lookup(prompt.prefix_tokens)
    restore_s = store_s = 0.0
    if lookup.kept is not None:
        t0 = time.perf_counter()
        backend.load_state(lookup.kept.state)
        restore_s = time.perf_counter() - t0
        n_past = lookup.kept.state.n_tokens
        reuse = REUSE_RESTORED if n_past == n_prefix else REUSE_RESTORED_STORED
    else:
        if lookup.differs_at is not None:
            store.drop()  # unusable for this prompt and about to be replaced: not worth a copy
        store_s = backend.clear()
        n_past = 0
        reuse = REUSE_STORED if lookup.differs_at is None else REUSE_MISS.format(n=lookup.differs_at)

    costs: list[PrefillCost] = []
    if n_past < n_prefix:
        costs.append(backend.prefill(tokens[n_past:n_prefix], n_past))
        t0 = time.perf_counter()
        state = backend.save_state()
        store_s += time.perf_counter() - t0
        # Stored before the rest is prefilled: the state must be the one at the prefix boundary.
        store.store(prompt.prefix_tokens, state)
    return _Prefilled(costs=tuple(costs), n_reused=n_past, restore_s=restore_s, store_s=store_s, reuse=reuse)


def failure_message(stage: str, exc: Exception) -> str:
    """An ``error`` for a backend failure during ``stage``: its own message when it is decide's."""
    if isinstance(exc, DecideBackendError):
        return str(exc)
    return f"decide: the backend failed while {stage}: {type(exc).__name__}: {exc}"


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
