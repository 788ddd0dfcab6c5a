"""The Decider: plain decisions start to finish over the two ports, with the state it owns (the
kept prefix, the neutral prompt's side). Debiasing wraps it (``service.py``); docs/decide.md.

Sequencing rule (what makes a restored prefix exact): with the prefix cache on, a prompt is always
prefilled as [prefix piece][rest piece], whether or not a state was restored. A fresh decision and
one that restored the same prefix therefore run the same rest-piece graph over the same state, and
their logits agree bit for bit. Without the cache (off, opted out) the prompt is prefilled whole,
as one piece, which is what perplexity() over the same text computes.

Batches: decisions that keep the same prefix share one prefix piece, and their rest pieces go into
one ``prefill_batch`` call, each on its own copy of the prefix state, the same piece each would
prefill alone. Full scoring: after the prompt, every choice's tokens are prefilled on forked copies
of it (``continuations``); such a request runs alone, its choices fill the side sequences.

Side sequences may open late (``decide_batch`` auto): before a list that would use them runs
(``wants_side_sequences``), the decider drops its kept state and has them opened, since opening may
cost the sequence its KV. The next decision prefills its prefix again (exact, just not reused once).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bmoe.decide.accounting import Prefilled, Scored, result, share_of
from bmoe.decide.checks import Tokenized, check_requests, failure_message, shares_prefix, wants_side_sequences
from bmoe.decide.choice_scorer import score_choices
from bmoe.decide.continuations import NeutralStore, continuation_logps
from bmoe.decide.errors import DecideCancelled
from bmoe.decide.kept_prefix import PrefixStore
from bmoe.decide.port import BYTES_PER_MIB, PrefillCost, SequencePort, TextPort
from bmoe.decide.prompt_split import SplitPrompt
from bmoe.decide.scoring_modes import full_scores
from bmoe.decide.types import BatchShare, ChoiceScores, DecideRequest, DecideResult
from bmoe.numerics import log_softmax

# What happened to the kept prefix state, as BMOE_DECIDE's "reuse" says it.
REUSE_RESTORED = "restored"  # the kept state was exactly this prefix: restored, nothing stored
REUSE_RESTORED_STORED = "restored+stored"  # kept state extended: restored, longer prefix stored
REUSE_STORED = "stored"  # nothing was kept: prefix prefilled and stored
REUSE_MISS = "miss: prefix differs at token {n}"  # kept state unusable: replaced by this prefix
REUSE_OFF = "off"  # the session keeps no prefix state; prefilled whole
REUSE_OPTED_OUT = "opted out"  # reuse_prefix false: prefilled whole, kept state left as it was
REUSE_NO_PREFIX = "no prefix"  # the prefix is empty on tokens: prefilled whole, kept state left

_batch_ids = itertools.count(1)  # BatchShare.id: batches prefilled in this process


@dataclass(frozen=True, slots=True)
class DecidePolicy:
    """Session-wide decide settings, resolved at startup."""

    keep_prefix: bool  # from resolve_keep_prefix()


class Decider:
    """Answers plain decisions (no debiasing) over ``text`` and ``seq``, owning what it keeps
    between them: the prefix state (``store``; passed down to ``seq.keep`` whenever it changes)
    (the session builds the store and hands it in) and the neutral prompt's side of full scoring (``neutral``, kept for the session's life: a
    generate() does not touch it, it lives in a copy)."""

    def __init__(
        self,
        text: TextPort,
        seq: SequencePort,
        policy: DecidePolicy,
        store: PrefixStore,
        neutral: NeutralStore | None = None,
    ) -> None:
        self.text, self.seq, self.policy = text, seq, policy
        self.store = store
        self.neutral = neutral if neutral is not None else NeutralStore()

    def answer(self, requests: Sequence[DecideRequest], stop: Callable[[], bool] = lambda: False) -> list[DecideResult]:
        """One answer per plain request, in order, each as if answered alone after the ones before.

        Every check runs first; a refused request is answered at once and spoils nothing. ``stop``
        is asked before each decision or batch runs, and by the sequence port between the calls of
        a batch: once it says so, every decision not answered yet is a ``DecideCancelled`` failure.

        With a sequence that batches (``max_batch() > 1``) and the prefix cache on, the requests
        that keep a prefix are grouped by it, each group's rest pieces prefilled together, at most
        ``max_batch()`` per call. Groups run in the order of their last request, so the state kept
        at the end is the one the last request would have left. Full-scored requests run alone."""
        checked = check_requests(self.text, self.seq, requests)
        if wants_side_sequences(requests, checked, self.policy.keep_prefix):
            try:
                self._open_side_sequences()
            except Exception as exc:  # the engine failed while re-creating its context
                msg = failure_message("opening the side sequences", exc)
                return [
                    c if isinstance(c, DecideResult) else DecideResult.failed(r.id, msg, exc)
                    for r, c in zip(requests, checked)
                ]
        cap = self.seq.max_batch() if self.policy.keep_prefix and len(requests) > 1 else 1
        results: list[DecideResult | None] = [None] * len(requests)
        units: dict[object, list[tuple[int, Tokenized]]] = {}
        for i, (request, tok) in enumerate(zip(requests, checked)):
            if isinstance(tok, DecideResult):
                results[i] = tok
                continue
            # Only first-token decisions that keep a prefix can share one; the others run alone, in order.
            key: object = tok.prompt.prefix_tokens if cap > 1 and shares_prefix(request, tok) else ("alone", i)
            units.setdefault(key, []).append((i, tok))
        for members in sorted(units.values(), key=lambda m: m[-1][0]):
            if len(members) == 1:
                i, tok = members[0]
                results[i] = _cancelled(requests[i]) if stop() else self._run_one(requests[i], tok)
                continue
            for start in range(0, len(members), cap):
                chunk = members[start : start + cap]
                answered = (
                    [_cancelled(requests[i]) for i, _ in chunk] if stop() else self._run_batch(requests, chunk, stop)
                )
                for i, answer in zip((i for i, _ in chunk), answered):
                    results[i] = answer
        return [r for r in results if r is not None]

    def drop(self) -> None:
        """A generate() or a score() is about to overwrite the sequence. The latest-prefix store
        drops its state (it is only worth its RAM between decisions); a store that outlasts them
        (``PrefixStore.lasting``) keeps its states, and the sequence copies out the one living in it."""
        if self.store.lasting and self.store.held:
            self._kept_changed()
            return
        self.forget()

    def save_kept(self) -> None:
        """At close: the states kept in RAM go to flash where the store has a flash tier (the one
        living in the sequence is copied out first), so that they outlast the process. The
        latest-prefix store has no flash tier: nothing to save."""
        if not self.store.lasting:
            return
        try:
            self.seq.clear()
            self.store.flush()
        except Exception:  # closing goes on; a state not saved is only computed again
            pass

    def forget(self) -> None:
        """Drop every state kept in RAM, and the sequence's buffers for them."""
        self.store.drop()
        self.seq.forget()

    # --- kept state ---------------------------------------------------------------------------
    def _kept_changed(self) -> None:
        self.seq.keep(self.store.held)

    def open_side_sequences(self) -> None:
        """``_open_side_sequences`` for a generation that scores on side sequences (a tool
        turn's name decision, runtime/tool_choice.py): called before its prompt is prefilled."""
        self._open_side_sequences()

    def _open_side_sequences(self) -> None:
        """Open the side sequences if none are open and some can be; the kept prefix state is
        dropped first (opening may empty the sequence it lives in)."""
        sides = self.seq.side_sequences()
        if sides.n_open or not sides.n_most:
            return  # open already, or none can be: batches run one by one, full scoring was refused
        self.forget()
        self.seq.open_side_sequences()

    # --- one decision -------------------------------------------------------------------------
    def _run_one(self, request: DecideRequest, tok: Tokenized) -> DecideResult:
        try:
            done = self._prefill(request, tok.prompt)
            row = self.seq.last_logits()
        except Exception as exc:
            return DecideResult.failed(request.id, failure_message("running the prompt", exc), exc)
        try:
            if tok.tokens is None:
                scores, scored = score_choices(row, tok.first, request.abstain_below), Scored()
            else:
                scores, scored = self._score_full(request, tok, row)
        except Exception as exc:
            return DecideResult.failed(request.id, failure_message("scoring the choices", exc), exc)
        return result(request, tok, done, scores, self.seq.held_bytes / BYTES_PER_MIB, scored=scored)

    def _score_full(self, request: DecideRequest, tok: Tokenized, row: np.ndarray) -> tuple[ChoiceScores, Scored]:
        """Every token of every choice after the prompt (the sequence holds it, ``row`` is its last
        logits), and after the neutral prompt when the request wants that."""
        assert tok.tokens is not None
        per_token, costs = continuation_logps(self.seq, row, tok.tokens, tok.prompt.n_tokens)
        per_token_neutral = None
        how = None
        if tok.neutral is not None:
            per_token_neutral, more, how = self.neutral.logps(self.seq, tok.neutral, tok.tokens)
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
        mib = None if how is None else self.neutral.kept_mib
        return scores, Scored(costs=tuple(costs), uncond_reuse=how, uncond_state_mib=mib)

    def _prefill(self, request: DecideRequest, prompt: SplitPrompt) -> Prefilled:
        tokens = prompt.tokens
        keep = self.policy.keep_prefix
        if not keep or not request.reuse_prefix or prompt.n_prefix == 0:
            reuse = REUSE_OFF if not keep else REUSE_OPTED_OUT if not request.reuse_prefix else REUSE_NO_PREFIX
            store_s = self.seq.clear()  # a kept state still in the sequence is copied out first
            cost = self.seq.prefill(tokens, 0)
            return Prefilled(costs=(cost,), n_reused=0, restore_s=0.0, store_s=store_s, reuse=reuse)
        head = self._prefix_piece(prompt)
        rest = self.seq.prefill(tokens[prompt.n_prefix :], prompt.n_prefix)
        return Prefilled(head.costs + (rest,), head.n_reused, head.restore_s, head.store_s, head.reuse, head.tier)

    def _prefix_piece(self, prompt: SplitPrompt) -> Prefilled:
        """Bring the sequence to exactly the prompt's prefix: the kept state restored, extended or
        replaced (then stored). ``costs`` holds the prefix piece's prefill when one ran."""
        seq, store = self.seq, self.store
        n_prefix = prompt.n_prefix
        lookup = store.lookup(prompt.prefix_tokens)
        restore_s = store_s = 0.0
        if lookup.kept is not None:
            self._kept_changed()  # a state read from flash is in RAM now, and others may have left
            t0 = time.perf_counter()
            seq.load_state(lookup.kept.state)
            restore_s = lookup.load_s + time.perf_counter() - t0
            n_past = lookup.kept.state.n_tokens
            reuse = REUSE_RESTORED if n_past == n_prefix else REUSE_RESTORED_STORED
        else:
            if lookup.differs_at is not None:
                store.make_room(prompt.prefix_tokens)  # what storing evicts is not worth a copy
                self._kept_changed()
            store_s = seq.clear()
            n_past = 0
            reuse = REUSE_STORED if lookup.differs_at is None else REUSE_MISS.format(n=lookup.differs_at)
        costs: tuple[PrefillCost, ...] = ()
        if n_past < n_prefix:
            costs = (seq.prefill(prompt.tokens[n_past:n_prefix], n_past),)
            t0 = time.perf_counter()
            state = seq.save_state()
            store_s += time.perf_counter() - t0
            # Stored before the rest is prefilled: the state must be the one at the prefix boundary.
            store.store(prompt.prefix_tokens, state)
            self._kept_changed()
        tier = lookup.tier if lookup.kept is not None else ""
        return Prefilled(costs, n_past, restore_s, store_s, reuse, tier)

    # --- a batch ------------------------------------------------------------------------------
    def _run_batch(
        self, requests: Sequence[DecideRequest], members: list[tuple[int, Tokenized]], stop: Callable[[], bool]
    ) -> list[DecideResult]:
        """Prefill the members' rest pieces together after their shared prefix (kept, restored or
        computed and stored, as ``_prefill`` does for one decision)."""
        n_prefix = members[0][1].prompt.n_prefix
        try:
            head = self._prefix_piece(members[0][1].prompt)
            suffixes = [tok.prompt.tokens[n_prefix:] for _, tok in members]
            rows, cost = self.seq.prefill_batch(suffixes, n_prefix, stop=stop)
        except DecideCancelled:
            return [_cancelled(requests[i]) for i, _ in members]
        except Exception as exc:
            msg = failure_message("running the prompt", exc)
            return [DecideResult.failed(requests[i].id, msg, exc) for i, _ in members]
        share = BatchShare(
            id=next(_batch_ids),
            size=len(members),
            n_tokens=cost.n_tokens,
            prefill_s=cost.prefill_s,
            read_mb=cost.read_mb,
        )
        out: list[DecideResult] = []
        for k, ((i, tok), row) in enumerate(zip(members, rows)):
            request = requests[i]
            mine = share_of(cost, tok.prompt.n_tokens - n_prefix)
            # The first member pays for the prefix piece, as it would alone; the others find it kept.
            done = (
                Prefilled(head.costs + (mine,), head.n_reused, head.restore_s, head.store_s, head.reuse, head.tier)
                if k == 0
                else Prefilled((mine,), n_prefix, 0.0, 0.0, REUSE_RESTORED)
            )
            try:
                scores = score_choices(row, tok.first, request.abstain_below)
            except Exception as exc:
                out.append(DecideResult.failed(request.id, failure_message("scoring", exc), exc))
                continue
            out.append(result(request, tok, done, scores, self.seq.held_bytes / BYTES_PER_MIB, batch=share))
        return out


def _cancelled(request: DecideRequest) -> DecideResult:
    exc = DecideCancelled("decide: cancelled before this decision ran (the request was cancelled)")
    return DecideResult.failed(request.id, str(exc), exc)
