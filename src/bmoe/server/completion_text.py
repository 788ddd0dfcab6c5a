"""/v1/completions' answers in OpenAI's legacy shape: a token's text, and the ``logprobs`` object
(``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``) one answer carries, from the
prompt scorer (completion_scoring.py) or a generation's steps (completion_generation.py)."""

from __future__ import annotations

import codecs
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bmoe.session import GenerateRequest, Session


def token_str(session: Session, tok: int) -> str:
    """A token as text; a token that is not whole UTF-8 on its own as ``bytes:\\xNN...``, as OpenAI does."""
    raw = session.model.token_bytes(tok, special=True)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def texts_of(session: Session, tokens: Sequence[int]) -> tuple[str, list[int]]:
    """The tokens' text and each token's character offset in it (the characters decoded before
    it: a character split over tokens counts at the token that completes it)."""
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    parts: list[str] = []
    offsets: list[int] = []
    n = 0
    for t in tokens:
        offsets.append(n)
        piece = dec.decode(session.model.token_bytes(t, special=True))
        parts.append(piece)
        n += len(piece)
    parts.append(dec.decode(b"", final=True))
    return "".join(parts), offsets


def lp_or_none(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


@dataclass(slots=True)
class LegacyLogprobs:
    """The four parallel lists of one answer's ``logprobs`` object, filled position by position."""

    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)

    def add(self, token: str, logprob: float | None, top: dict[str, float] | None, offset: int) -> None:
        self.tokens.append(token)
        self.token_logprobs.append(logprob)
        self.top_logprobs.append(top)
        self.text_offset.append(offset)

    def __len__(self) -> int:
        return len(self.tokens)

    def cut(self, start: int, end: int | None = None) -> LegacyLogprobs:
        s = slice(start, end)
        return LegacyLogprobs(self.tokens[s], self.token_logprobs[s], self.top_logprobs[s], self.text_offset[s])

    def extend(self, other: LegacyLogprobs) -> None:
        self.tokens += other.tokens
        self.token_logprobs += other.token_logprobs
        self.top_logprobs += other.top_logprobs
        self.text_offset += other.text_offset

    def shape(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }


@dataclass(frozen=True, slots=True)
class Piece:
    """What one streamed chunk carries of prompt ``index``'s answer; ``finish_reason`` on its last."""

    index: int
    text: str
    logprobs: LegacyLogprobs | None = None
    finish_reason: str | None = None
    telemetry: dict[str, Any] | None = None  # with finish_reason: the prompt's bmoe.prompts entry


@dataclass(frozen=True, slots=True)
class PromptAnswer:
    """One prompt's answer: ``choices[index]``, what it counts in ``usage``, its ``bmoe.prompts`` entry."""

    index: int
    text: str
    logprobs: LegacyLogprobs | None
    finish_reason: str  # "stop" | "length"
    n_prompt: int  # the prompt's tokens
    n_generated: int
    n_reused: int  # of the prompt's tokens, found in the KV
    telemetry: dict[str, Any]  # bmoe.prompts[index]: n_reused, n_prefilled, prefill_s, prefill_fallback, ...
    read_bytes: int = 0  # from storage while answering (a streamed model's experts): bmoe_read_mib_total

    def choice(self) -> dict[str, Any]:
        lps = self.logprobs.shape() if self.logprobs is not None else None
        return {"index": self.index, "text": self.text, "logprobs": lps, "finish_reason": self.finish_reason}


def response_body(answers: Sequence[PromptAnswer]) -> dict[str, Any]:
    """``choices``, ``usage`` and ``bmoe`` of a response (or of a stream's last chunks)."""
    n_prompt = sum(a.n_prompt for a in answers)
    n_gen = sum(a.n_generated for a in answers)
    per = [a.telemetry for a in answers]
    return {
        "choices": [a.choice() for a in answers],
        "usage": {
            "prompt_tokens": n_prompt,
            "completion_tokens": n_gen,
            "total_tokens": n_prompt + n_gen,
            "prompt_tokens_details": {"cached_tokens": sum(a.n_reused for a in answers)},
        },
        "bmoe": {
            "n_reused": sum(p["n_reused"] for p in per),
            "n_prefilled": sum(p["n_prefilled"] for p in per),
            "prefill_s": sum(p["prefill_s"] for p in per),
            "prompts": per,
        },
    }


@dataclass(frozen=True, slots=True)
class Generation:
    """One request's generation settings, as the route checked them."""

    max_tokens: int | None  # None: DEFAULT_MAX_TOKENS, or what the context has room for
    echo: bool
    top_n: int | None  # logprobs: None, or alternatives per position (0..20)
    temperature: float | None  # None: the session's (--temp)
    top_p: float | None
    seed: int | None
    stops: tuple[str, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    json_schema: dict | bool | None = None
    grammar: str | None = None
    jump_forward: bool = False

    def request(self, n_predict: int) -> GenerateRequest:
        return GenerateRequest(
            prompt="",
            n_predict=n_predict,
            clear_kv=False,  # reuse what the KV holds of the prompt
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            json_schema=self.json_schema,
            grammar=self.grammar,
            jump_forward=self.jump_forward,
            top_logprobs=self.top_n,
            logit_bias=self.logit_bias,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
        )
