"""POST /v1/completions: OpenAI's legacy completion API over raw prompts, streamed (SSE) or not.

Two paths answer it, both on the one worker, every prompt of a list in turn (checked first, all of
them, before any is answered):
- scoring (completion_scoring.py): ``max_tokens`` 0 or 1, no stop strings, no constraint: what
  lm-evaluation-harness sends for log-likelihoods, answered by the prompt scorer;
- generation (completion_generation.py): everything else, the raw prompt continued with no chat
  template, constrained by ``grammar``, ``json_schema`` or ``response_format`` as chat is, and
  answered by a decision where the answer is one of a finite set (completion_choice.py).
docs/server.md has the fields, the answer and every refusal.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from bmoe.errors import RequestError
from bmoe.server.completion_generation import answer_prompt, n_predict_for
from bmoe.server.completion_scoring import score_request, scored_answer
from bmoe.server.completion_text import Generation, Piece, PromptAnswer, response_body
from bmoe.server.errors import ApiError, error_body, from_request_error
from bmoe.server.job_queue import ERROR, RESULT, STEP, Cancelled, Job, JobQueue
from bmoe.server.metrics import MIB, Metrics
from bmoe.server.openai_fields import COMPLETION_FIELDS, constraint_fields, refuse_unset
from bmoe.server.run_job import cancel_on_disconnect, job_error
from bmoe.server.schemas import CompletionRequest
from bmoe.session import ScoreRequest, ScoreResult, Session

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# The session's field names in a refusal, as the API calls them.
_FIELD = {"tokens": "prompt", "n_predict": "max_tokens", "top_n": "logprobs"}


def prompts_of(body: CompletionRequest) -> tuple[list[str | list[int]], bool]:
    """The request's prompts (text or token ids), and whether it sent a list of them."""
    p = body.prompt
    if isinstance(p, str):
        return [p], False
    if p and isinstance(p[0], int):
        return [list(p)], False
    return list(p), True  # type: ignore[arg-type]


def refusal(e: RequestError, param: str) -> ApiError:
    """A session refusal in the API's words: its field (``tokens: ...``) renamed to ``param``."""
    field, _, rest = str(e).partition(": ")
    head, dot, index = field.partition(".")  # "tokens.3": the prompt's token 3
    name = _FIELD.get(head, head)
    name = (param if head == "tokens" else name) + dot + index
    return from_request_error(RequestError(f"{name}: {rest}"), name)


def generation_of(body: CompletionRequest) -> Generation:
    """The request's settings, checked (a 400 naming the field) before anything is queued."""
    refuse_unset(body, COMPLETION_FIELDS)
    if body.jump_forward and body.logprobs is not None:
        raise ApiError(
            400, "jump_forward: a forced token has no log-prob of its own; not with logprobs", "jump_forward"
        )
    schema, grammar = constraint_fields(body)
    return Generation(
        max_tokens=body.max_tokens,
        echo=body.echo,
        top_n=body.logprobs,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stops=body.stop_list(),
        logit_bias=body.bias(),
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        json_schema=schema,
        grammar=grammar,
        jump_forward=body.jump_forward,
    )


def scores(g: Generation) -> bool:
    """Whether the scoring path answers: at most one token, nothing to stop or constrain."""
    return g.max_tokens in (0, 1) and not g.stops and g.json_schema is None and g.grammar is None


class CompletionsRoute:
    def __init__(self, queue: JobQueue, metrics: Metrics, model_id: str) -> None:
        self.queue, self.metrics, self.model_id = queue, metrics, model_id

    def _fn(self, body: CompletionRequest, stream: bool = False) -> Callable[[Session, Job], dict[str, Any]]:
        g = generation_of(body)  # its refusals before anything is queued
        prompts, many = prompts_of(body)

        def fn(session: Session, job: Job) -> dict[str, Any]:  # on the worker: the only thread that touches the model
            emit = (lambda p: job.emit(STEP, p)) if stream else (lambda p: None)
            checked: list[tuple[list[int], int]] = []
            for i, p in enumerate(prompts):  # every prompt is checked before any is answered
                param = f"prompt.{i}" if many else "prompt"
                toks = session.model.tokenize(p, add_special=True, parse_special=True) if isinstance(p, str) else p
                n_predict = g.max_tokens if scores(g) else 0
                if not scores(g) and len(toks) >= session.n_ctx:  # no room: said as generation says it
                    n_predict_for(session, g, len(toks), param)
                try:
                    session.check_score(
                        ScoreRequest(tokens=tuple(toks), n_predict=n_predict or 0, logit_bias=g.logit_bias)
                    )
                except RequestError as e:
                    raise refusal(e, param) from e
                if not scores(g):
                    n_predict = n_predict_for(session, g, len(toks), param)
                checked.append((list(toks), n_predict or 0))
            answers: list[PromptAnswer] = []
            try:
                if scores(g):
                    results: list[ScoreResult] = []
                    sampling = {
                        "temperature": g.temperature or 0.0,
                        "top_p": g.top_p or 1.0,
                        "seed": g.seed,
                        "logit_bias": g.logit_bias,
                    }
                    for i, (toks, n) in enumerate(checked):
                        if job.cancelled.is_set():  # the client left: the prompts not scored yet are not
                            raise Cancelled("the client closed the request")
                        r = session.score(score_request(toks, n, g.echo, g.top_n, sampling))
                        results.append(r)
                        answers.append(scored_answer(session, i, r, g.echo, g.top_n))
                        a = answers[-1]
                        emit(Piece(i, a.text, a.logprobs, a.finish_reason, a.telemetry))
                else:
                    for i, (toks, n) in enumerate(checked):
                        answers.append(answer_prompt(session, job, g, i, toks, n, emit))
            except Cancelled:
                self.metrics.cancelled.inc()
                raise
            finally:
                self._count(answers)  # those answered count as work done, whatever happened after
            return response_body(answers)

        return fn

    def _count(self, answers: list[PromptAnswer]) -> None:
        m = self.metrics
        for a in answers:
            m.prompt_tokens.inc(a.telemetry["n_prefilled"])
            m.reused_tokens.inc(a.telemetry["n_reused"])
            m.completion_tokens.inc(a.n_generated)
            m.prefill_seconds.inc(a.telemetry["prefill_s"])
            m.decode_seconds.inc(a.telemetry.get("decode_s", 0.0))
            m.read_mib.inc(a.read_bytes / MIB)

    async def __call__(self, body: CompletionRequest, request: Request) -> Any:
        job = self.queue.submit(self._fn(body, body.stream))
        watcher = asyncio.create_task(cancel_on_disconnect(request, job))
        handed_over = False
        head = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time())}
        head["model"] = self.model_id
        try:
            first = await job.next_event() if body.stream else await job.outcome()
            _raise_for(first.kind, first.value)
            if not body.stream:
                return {**head, **first.value}
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            handed_over = True
            return StreamingResponse(
                self._sse(first, job, watcher, head, include_usage), media_type="text/event-stream", headers=SSE_HEADERS
            )
        finally:
            if not handed_over:
                watcher.cancel()
                if not job.finished:
                    job.cancel()

    async def _sse(
        self, ev: Any, job: Job, watcher: asyncio.Task, head: dict[str, Any], include_usage: bool
    ) -> AsyncIterator[str]:
        try:
            while True:
                if ev.kind == ERROR:
                    err = job_error(ev.value, lambda e: from_request_error(e, None))
                    status = err.status if isinstance(err, ApiError) else 500
                    if status != 499:
                        yield f"data: {json.dumps(error_body(status, str(err)))}\n\n"
                    return
                if ev.kind == RESULT:
                    if include_usage:  # OpenAI's shape: a chunk with no choices, only usage
                        yield _data({**head, "choices": [], "usage": ev.value["usage"], "bmoe": ev.value["bmoe"]})
                    break
                p: Piece = ev.value
                lps = p.logprobs.shape() if p.logprobs is not None else None
                choice = {"index": p.index, "text": p.text, "logprobs": lps, "finish_reason": p.finish_reason}
                extra = {"bmoe": p.telemetry} if p.telemetry is not None else {}
                yield _data({**head, "choices": [choice], **extra})
                ev = await job.next_event()
            yield "data: [DONE]\n\n"
        finally:  # the client left (or the stream ended): stop generating for nobody
            watcher.cancel()
            if not job.finished:
                job.cancel()


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _raise_for(kind: str, value: Any) -> None:
    if kind == ERROR:
        raise job_error(value, lambda e: from_request_error(e, None)) from value
