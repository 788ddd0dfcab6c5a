"""A generation turn over a raw prompt: the caller's token ids in, Steps out (/v1/completions).

No chat template, no history: the tokens go into the model as they are, and the turn runs as a
chat turn runs (``Runtime.run``: the same KV reuse, sampler, constraint mask, jump-forward, stops
at an end-of-generation token). Its ``messages`` are None, which tells ``run`` (and the choice
walk) to leave the session's chat history as it was; the KV keeps what the turn left, so a next
raw prompt that extends it reuses it, and the next chat turn reuses whatever prefix agrees.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from bmoe.constrain import constraint_of
from bmoe.errors import ContextOverflowError, RequestError
from bmoe.runtime.chat import Prompt
from bmoe.runtime.results import GenerateRequest
from bmoe.runtime.sampling import Sampler
from bmoe.runtime.scoring import check_token_ids
from bmoe.runtime.turn import Turn

if TYPE_CHECKING:
    from bmoe.runtime.runtime import Runtime


def prepare_raw(rt: Runtime, req: GenerateRequest, tokens: Sequence[int]) -> Turn:
    """The turn of ``tokens`` (the whole prompt, BOS included if wanted), refused with a
    RequestError naming ``tokens`` before anything in the KV changes. ``req.prompt``, ``images``,
    ``think`` and ``tools`` are not read: the prompt is the tokens (``clear_kv`` false: reuse the
    prefix the KV holds)."""
    toks = list(tokens)
    if not toks:
        raise RequestError("tokens: is empty; give at least one token")
    check_token_ids(toks, rt.model.n_vocab)
    if req.keep_logits and req.jump_forward:
        raise RequestError("jump_forward: forced tokens have no logit row of their own; not with keep_logits")
    cfg = rt.config
    n_predict = req.n_predict if req.n_predict is not None else cfg.n_predict
    if len(toks) + n_predict > rt.n_ctx:
        raise ContextOverflowError(
            f"tokens: {len(toks)} tokens, plus n_predict ({n_predict}), do not fit the context (n_ctx {rt.n_ctx})"
        )
    constraint = constraint_of(req.json_schema, req.grammar)
    sampler = Sampler(
        cfg.temperature if req.temperature is None else req.temperature,
        cfg.top_p if req.top_p is None else req.top_p,
        cfg.seed if req.seed is None else req.seed,
        req.logit_bias,
        req.presence_penalty,
        req.frequency_penalty,
    )
    mask = rt.token_mask(constraint) if constraint is not None else None
    return Turn(req, None, toks, n_predict, sampler, Prompt(()), False, False, mask)
