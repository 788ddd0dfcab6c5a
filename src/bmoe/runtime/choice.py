"""Constrained greedy decoding of an answer that is one of a few texts, stopped where it is settled.

When a turn's constraint allows only ``texts`` (constrain/choices.py), greedy decoding runs as
``Runtime.run`` runs it (the same prompt, KV reuse, mask and sampler, one token per step), and
stops at the first token after which only one of the texts fits: the grammar forces the rest of
it and its end, so the rest is not decoded. The text is then exactly what ``run`` would return.
A prefill of the prompt, and one decode per token before the texts part ways: for texts whose
first tokens differ, that is the prefill alone (docs/decide.md "Decisions behind the standard
fields").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bmoe.runtime.chat import Message

if TYPE_CHECKING:
    from bmoe.runtime.runtime import Runtime
    from bmoe.runtime.turn import Turn


@dataclass(frozen=True, slots=True)
class ChoiceWalk:
    text: str  # the answer, one of the texts
    tokens: tuple[int, ...]  # the tokens greedy took until the text was settled
    n_prompt: int  # prompt tokens prefilled (after the reused prefix)
    n_reused: int
    n_past: int
    prefill_s: float
    decode_s: float  # the decode steps before the text was settled
    prefill_fallback: str


def walk_choices(rt: Runtime, turn: Turn, texts: Sequence[str]) -> ChoiceWalk:
    """Greedy's answer to ``turn`` (constrained to exactly ``texts``, temperature 0)."""
    mask, sampler = turn.mask, turn.sampler
    if mask is None:
        raise ValueError("walk_choices needs a constrained turn")
    plan = rt.kv.align(turn.prompt, reuse=not turn.req.clear_kv)
    t0 = time.perf_counter()
    logits = rt.kv.append(turn.prompt[plan.n_reused :])
    prefill_s = time.perf_counter() - t0
    left = [t.encode() for t in texts]
    at, out = b"", []
    while True:
        assert logits is not None
        tok = sampler.sample(mask.mask(logits))
        sampler.taken(tok)
        if rt.model.is_eog(tok):  # the grammar allowed the end: ``at`` is a whole text
            left = [at]
            break
        out.append(tok)
        at += rt.model.token_bytes(tok)
        left = [c for c in left if c.startswith(at)]
        if len(left) == 1 or mask.advance(tok):
            left = left if len(left) == 1 else [at]
            break
        logits = rt.kv.append([tok])
    text = left[0].decode("utf-8")
    if turn.messages is not None:  # a raw prompt's walk leaves the chat history alone
        rt.history = turn.messages + [Message("assistant", text)]
    return ChoiceWalk(
        text=text,
        tokens=tuple(out),
        n_prompt=len(turn.prompt) - plan.n_reused,
        n_reused=plan.n_reused,
        n_past=rt.kv.n_past,
        prefill_s=prefill_s,
        decode_s=time.perf_counter() - t0 - prefill_s,
        prefill_fallback=plan.fallback,
    )
