"""Chat turns through the store of kept states (docs/server.md "Interleaved conversations").

With a store that outlasts a generate() (``--state-ram-mib`` / ``--state-disk-mib``), a chat turn
keeps the state at the end of its last message: the next turn of the same conversation renders
the same text up to there, whatever other conversations ran in between, and restores it. Before
the turn runs, ``prepare_turn`` restores the longest kept state of the prompt (when it is longer
than what the sequence holds of it), prefills up to the boundary and stores the state there; the
generate loop then reuses those tokens as its KV prefix. A fresh generate() (``clear_kv``) and a
turn with images do the same. ``TurnReuse`` says what was done, so the
turn's result counts the boundary's prefill as prefilled, not reused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from bmoe.decide.decider import Decider
from bmoe.numerics import common_prefix_len
from bmoe.runtime.chat import Prompt
from bmoe.runtime.images import is_placeholder
from bmoe.runtime.results import GenerateResult
from bmoe.runtime.runtime import Runtime
from bmoe.runtime.turn import Turn


@dataclass(frozen=True, slots=True)
class TurnReuse:
    n_prefilled: int  # tokens prefilled here, before the generate loop (it counts them as reused)
    prefill_s: float
    tier: str  # where a restored state came from ("" when none was restored)
    restore_s: float

    def account(self, result: GenerateResult) -> GenerateResult:
        """The turn's result with the prefill done here counted as prefill."""
        if not self.n_prefilled and not self.tier:
            return result
        return replace(
            result,
            reuse_tier=self.tier,
            restore_s=self.restore_s,
            n_prompt=result.n_prompt + self.n_prefilled,
            n_reused=max(0, result.n_reused - self.n_prefilled),
            prefill_s=result.prefill_s + self.prefill_s,
        )


def boundary(runtime: Runtime, turn: Turn) -> int:
    """How many leading prompt tokens end with the turn's last message: the prompt's tokens that
    agree with the text up to the end of the last message's own text, less one token (the join:
    its last token may tokenize differently once more text follows). A prompt with images is
    measured from its end: what follows the last message (the template's markup, no image) is
    tokenized alone, and must be the prompt's last tokens."""
    parts = turn.rendered.parts
    last = max((i for i, (_, plain) in enumerate(parts) if plain), default=-1)
    if last < 0:
        return 0
    if any(is_placeholder(t) for t in turn.prompt):
        tail = runtime.model.tokenize_parts(parts[last + 1 :]) if last + 1 < len(parts) else []
        n_head = len(turn.prompt) - len(tail)
        if tail and turn.prompt[n_head:] != tail:
            return 0  # the markup merged into the message's last token: keep nothing
        return max(0, runtime.kv.snap(n_head - 1, turn.prompt))  # never inside an image's run
    head = runtime.tokenize_prompt(Prompt(parts[: last + 1]))
    return max(0, common_prefix_len(head, turn.prompt) - 1)


def prepare_turn(runtime: Runtime, decider: Decider, turn: Turn) -> tuple[Turn, TurnReuse]:
    """Bring the sequence to the turn's first ``boundary`` tokens and keep the state there; the
    turn to run. A fresh conversation (``clear_kv``) goes through the store too: it restores what
    an earlier call kept for the same tokens, and the turn it returns reuses the sequence's tokens
    (all of them the prompt's own) instead of emptying it."""
    store, seq, kv = decider.store, decider.seq, runtime.kv
    none = TurnReuse(0, 0.0, "", 0.0)
    if not store.lasting:
        return turn, none  # the latest-prefix store: a generate() drops it
    if turn.req.clear_kv:
        turn = turn._replace(req=replace(turn.req, clear_kv=False))
    b = boundary(runtime, turn)
    if b < 1:
        return turn, none
    head = turn.prompt[:b]
    n_held = min(common_prefix_len(kv.tokens, turn.prompt), b)
    if n_held < kv.n_past and (runtime.model.is_recurrent or runtime.model.is_hybrid):
        n_held = 0  # recurrent memory cannot be cut back to what agrees: it would be prefilled again
    lookup = store.lookup(head)
    tier, restore_s = "", 0.0
    if lookup.kept is not None and lookup.kept.state.n_tokens > n_held:
        seq.keep(store.held)
        t0 = time.perf_counter()
        seq.load_state(lookup.kept.state)
        tier, restore_s = lookup.tier, lookup.load_s + time.perf_counter() - t0
    elif lookup.kept is not None and lookup.kept.state.n_tokens == b and n_held == b:
        return turn, none  # the sequence holds it, and it is kept already
    plan = kv.align(head + [turn.prompt[b]])  # cut back to what agrees (a kept state is copied out first)
    t0 = time.perf_counter()
    if plan.n_reused < b:
        kv.append(head[plan.n_reused :])
    prefill_s = time.perf_counter() - t0
    store.store(head, seq.save_state())
    seq.keep(store.held)
    return turn, TurnReuse(b - plan.n_reused, prefill_s, tier, restore_s)
