"""POST /v1/completions: OpenAI's legacy completion API, for scoring prompts (max_tokens 0 or 1).

What lm-evaluation-harness's ``local-completions`` model sends for log-likelihood tasks: token-id
(or text) prompts with ``echo``, ``logprobs`` and ``max_tokens`` 1; it reads
``choices[i].logprobs.token_logprobs`` and ``top_logprobs`` past the context. Every prompt of a
request is scored in order in one job on the worker, and each reuses what the one before it (in
this request or the previous one) left in the KV: only the tail past the common prefix is
prefilled (``bmoe.n_reused``). docs/server.md has the fields, the answer and every refusal.
"""

from __future__ import annotations

import codecs
import math
import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import Request

from bmoe.errors import RequestError
from bmoe.server.errors import ApiError, from_request_error
from bmoe.server.job_queue import Cancelled, Job, JobQueue
from bmoe.server.metrics import Metrics
from bmoe.server.openai_fields import COMPLETION_FIELDS, refuse_unset
from bmoe.server.run_job import run_job
from bmoe.server.schemas import CompletionRequest
from bmoe.session import ScoreRequest, ScoreResult, Session

MAX_TOKENS_DEFAULT = 1  # OpenAI's default (16) is more than this route generates
# The session's field names in a refusal, as the API calls them.
_FIELD = {"tokens": "prompt", "n_predict": "max_tokens", "top_n": "logprobs"}


def _unsupported(body: CompletionRequest) -> None:
    """Refuse OpenAI fields this route does not implement, when they would change the answer
    (openai_fields.COMPLETION_FIELDS), and more than the one token it generates."""
    if body.max_tokens is not None and body.max_tokens > 1:
        raise ApiError(
            400,
            f"max_tokens: /v1/completions scores prompts and generates at most 1 token, got {body.max_tokens} "
            "(use /v1/chat/completions to generate text)",
            "max_tokens",
            "unsupported_field",
        )
    refuse_unset(body, COMPLETION_FIELDS)


def prompts_of(body: CompletionRequest) -> tuple[list[str | list[int]], bool]:
    """The request's prompts (text or token ids), and whether it sent a list of them."""
    p = body.prompt
    if isinstance(p, str):
        return [p], False
    if p and isinstance(p[0], int):
        return [list(p)], False
    return list(p), True  # type: ignore[arg-type]


def token_str(session: Session, tok: int) -> str:
    """A token as text; a token that is not whole UTF-8 on its own as ``bytes:\\xNN...``, as OpenAI does."""
    raw = session.model.token_bytes(tok, special=True)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _texts(session: Session, tokens: tuple[int, ...]) -> tuple[str, list[int]]:
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


def _lp(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def choice(session: Session, index: int, r: ScoreResult, echo: bool, top_n: int | None) -> dict[str, Any]:
    """One answer of the response: the text (with the prompt when echoed), and logprobs per
    position (from position 0 with echo, else only the picked token's)."""
    prompt_text, offsets = _texts(session, r.tokens[: r.n_prompt])
    gen = [] if r.eog else list(r.generated)  # an end-of-generation token adds no text
    gen_text, gen_offsets = _texts(session, tuple(gen))
    text = (prompt_text if echo else "") + gen_text
    offsets = (
        offsets + [len(prompt_text) + o for o in gen_offsets] + ([len(prompt_text) + len(gen_text)] if r.eog else [])
    )
    logprobs = None
    if top_n is not None:
        first = 0 if echo else r.n_prompt
        pos = range(first, len(r.tokens))
        logprobs = {
            "tokens": [token_str(session, r.tokens[j]) for j in pos],
            "token_logprobs": [_lp(r.token_logprobs[j]) for j in pos],
            "top_logprobs": [
                None
                if math.isnan(r.token_logprobs[j])
                else {token_str(session, int(t)): float(v) for t, v in zip(r.top_ids[j], r.top_logprobs[j])}
                for j in pos
            ],
            "text_offset": [offsets[j] for j in pos],
        }
    finish = "stop" if r.eog else "length"
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


def telemetry(results: list[ScoreResult]) -> dict[str, Any]:
    """The ``bmoe`` object: what was reused and prefilled, in total and per prompt."""
    per = [
        {
            "n_reused": r.n_reused,
            "n_prefilled": r.n_prefilled,
            "prefill_s": r.prefill_s,
            "prefill_fallback": r.prefill_fallback,
        }
        for r in results
    ]
    return {
        "n_reused": sum(r.n_reused for r in results),
        "n_prefilled": sum(r.n_prefilled for r in results),
        "prefill_s": sum(r.prefill_s for r in results),
        "prompts": per,
    }


def refusal(e: RequestError, param: str) -> ApiError:
    """A session refusal in the API's words: its field (``tokens: ...``) renamed to ``param``."""
    field, _, rest = str(e).partition(": ")
    head, dot, index = field.partition(".")  # "tokens.3": the prompt's token 3
    name = _FIELD.get(head, head)
    name = (param if head == "tokens" else name) + dot + index
    return from_request_error(RequestError(f"{name}: {rest}"), name)


class CompletionsRoute:
    def __init__(self, queue: JobQueue, metrics: Metrics, model_id: str) -> None:
        self.queue, self.metrics, self.model_id = queue, metrics, model_id

    def _fn(self, body: CompletionRequest) -> Callable[[Session, Job], dict[str, Any]]:
        prompts, many = prompts_of(body)
        n_predict = MAX_TOKENS_DEFAULT if body.max_tokens is None else body.max_tokens
        echo, top_n, bias = body.echo, body.logprobs, body.bias()

        def fn(session: Session, job: Job) -> dict[str, Any]:  # on the worker: the only thread that touches the model
            reqs: list[ScoreRequest] = []
            for i, p in enumerate(prompts):
                param = f"prompt.{i}" if many else "prompt"
                toks = session.model.tokenize(p, add_special=True, parse_special=True) if isinstance(p, str) else p
                req = ScoreRequest(
                    tokens=tuple(toks),
                    echo=echo,
                    top_n=top_n or 0,
                    n_predict=n_predict,
                    temperature=body.temperature or 0.0,
                    top_p=body.top_p or 1.0,
                    seed=body.seed,
                    logit_bias=bias,
                )
                try:
                    session.check_score(req)  # every prompt is checked before any is scored
                except RequestError as e:
                    raise refusal(e, param) from e
                reqs.append(req)
            results: list[ScoreResult] = []
            for req in reqs:
                if job.cancelled.is_set():  # the client left: the prompts not scored yet are not
                    self.metrics.completion(results)  # those scored so far count as work done
                    self.metrics.cancelled.inc()
                    raise Cancelled("the client closed the request")
                results.append(session.score(req))
            self.metrics.completion(results)
            n_prompt = sum(r.n_prompt for r in results)
            n_gen = sum(len(r.generated) for r in results)
            return {
                "choices": [choice(session, i, r, echo, top_n) for i, r in enumerate(results)],
                "usage": {
                    "prompt_tokens": n_prompt,
                    "completion_tokens": n_gen,
                    "total_tokens": n_prompt + n_gen,
                    "prompt_tokens_details": {"cached_tokens": sum(r.n_reused for r in results)},
                },
                "bmoe": telemetry(results),
            }

        return fn

    async def __call__(self, body: CompletionRequest, request: Request) -> dict[str, Any]:
        _unsupported(body)
        answer = await run_job(self.queue, request, self._fn(body))
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_id,
            **answer,
        }
