"""Log-probs on /v1/chat/completions: the answer's tokens in OpenAI's shape, and bmoe's
``bmoe_logprobs_of``, the log-prob of named strings at the answer's start, answered by a decision.

The numbers are the model's own distribution at each position (the log-softmax of the raw logits,
before ``logit_bias``, temperature and top-p), as the runtime computes them (runtime/sampling.py
``TokenLogprobs``); docs/server.md "Log-probs".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bmoe.server.errors import ApiError
from bmoe.session import DecideRequest, Message, Session, Step

ENTRY = dict[str, Any]  # one element of choices[i].logprobs.content


def _token(session: Session, tok: int) -> tuple[str, list[int]]:
    raw = session.model.token_bytes(tok, special=True)
    return raw.decode("utf-8", errors="replace"), list(raw)


def conversation_decision(messages: Sequence[Message], choices: Sequence[str]) -> DecideRequest:
    """A full-scoring decision over ``choices`` as the answer to the conversation's last message,
    the messages before it its history (the kept prefix, as /v1/decide keeps one)."""
    *history, user = messages
    return DecideRequest(
        id=0,
        prefix="",
        suffix=user.content,
        choices=tuple(choices),
        scoring="full",
        history=tuple((m.role, m.content) for m in history),
    )


class LogprobsCollector:
    """Turns the Steps of a turn into ``content`` entries: ``take()`` gives those not given yet
    (what a streamed chunk carries), ``content`` all of them (the non-streamed answer)."""

    def __init__(self, session: Session, on: bool) -> None:
        self.session, self.on = session, on
        self.content: list[ENTRY] = []
        self._given = 0

    def add(self, step: Step) -> None:
        lp = step.logprobs
        if lp is None or step.token < 0:
            return
        text, raw = _token(self.session, step.token)
        top = []
        for t, v in zip(lp.top_ids, lp.top_logprobs):
            t_text, t_raw = _token(self.session, t)
            top.append({"token": t_text, "logprob": v, "bytes": t_raw})
        self.content.append({"token": text, "logprob": lp.logprob, "bytes": raw, "top_logprobs": top})

    def take(self) -> tuple[ENTRY, ...]:
        out = tuple(self.content[self._given :])
        self._given = len(self.content)
        return out

    def answer(self) -> dict[str, Any] | None:
        """``choices[0].logprobs``: None unless asked for."""
        return {"content": self.content, "refusal": None} if self.on else None


def check_bias(session: Session, bias: tuple[tuple[int, float], ...]) -> None:
    """A 400 naming a logit_bias key that is not one of the model's token ids."""
    n_vocab = session.model.n_vocab
    for tok, _ in bias:
        if tok >= n_vocab:
            raise ApiError(
                400,
                f"logit_bias: {tok} is not a token id of this model (0..{n_vocab - 1})",
                "logit_bias",
                "invalid_request",
            )


def logprobs_of(session: Session, messages: tuple[Message, ...], strings: tuple[str, ...]) -> list[dict[str, Any]]:
    """Each string's log-prob as the start of the answer to ``messages``: the whole string's
    tokens, summed (a decision's ``"scoring": "full"`` over the conversation, docs/decide.md);
    a refusal is a 400 naming the field."""
    field = "bmoe_logprobs_of"
    if any(m.images for m in messages):
        raise ApiError(
            400, f"{field}: is not answered for a conversation with images, for now", field, "unsupported_field"
        )
    if session.decider is None:
        raise ApiError(400, f"{field}: needs decide, and this server runs with --no-decide", field, "unsupported_field")
    r = session.decide(conversation_decision(messages, strings))
    if r.error is not None or r.scores is None:
        raise ApiError(400, f"{field}: {r.error}", field, "invalid_request")
    s = r.scores
    n_tokens = s.choice_tokens or (1,) * len(strings)
    return [
        {"text": t, "logprob": lp, "n_tokens": n} for t, lp, n in zip(strings, s.choice_logp, n_tokens, strict=True)
    ]
