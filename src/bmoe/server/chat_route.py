"""POST /v1/chat/completions: OpenAI's chat API over the session, streamed (SSE) or not.

A refusal (bad messages, context overflow, full queue) is answered before any token, with a
JSON error, even for stream=true: the SSE response starts only once the first token exists.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from bmoe.rules import IMAGE_MARKER
from bmoe.server.choice_answer import answer_turn
from bmoe.server.conversation import ChatTurn, Delta, TurnOutcome
from bmoe.server.errors import ApiError, error_body, from_request_error
from bmoe.server.images import inline_bytes
from bmoe.server.job_queue import ERROR, RESULT, Event, Job, JobQueue
from bmoe.server.logprobs import check_bias
from bmoe.server.metrics import Metrics
from bmoe.server.openai_fields import CHAT_FIELDS, constraint_fields, refuse_unset
from bmoe.server.run_job import cancel_on_disconnect, job_error
from bmoe.server.schemas import ChatCompletionRequest, ImagePart
from bmoe.server.think_fields import template_kwargs
from bmoe.server.tools_route import ToolsAsked, call_entries, message_calls, tools_asked
from bmoe.session import Message
from bmoe.wire.records import done_fields

_ROLES = {"developer": "system"}  # OpenAI's newer name for the system role
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _messages(body: ChatCompletionRequest, asked: ToolsAsked) -> tuple[Message, ...]:
    """The session's messages: each image part an image marker in its message's text, its data:
    URL's bytes among the message's images (docs/server.md "Images"); an assistant's tool calls
    and the call a tool message answers (docs/server.md "Tools")."""
    urls = [m.image_urls() for m in body.messages]
    with_images = any(urls)
    images: list[list[bytes]] = [[] for _ in body.messages]
    for i, (m, u) in enumerate(zip(body.messages, urls)):
        if u and m.role != "user":
            raise ApiError(
                400,
                f"messages.{i}: image parts are taken in user messages only, got one in a {m.role} message",
                f"messages.{i}.content",
            )
        parts = m.content if isinstance(m.content, list) else [m.content or ""]
        for j, p in enumerate(parts):
            if isinstance(p, ImagePart):
                images[i].extend(inline_bytes([p.image_url.url], f"messages.{i}.content.{j}.image_url.url"))
            elif with_images and IMAGE_MARKER in (p if isinstance(p, str) else p.text):
                where = f"messages.{i}.content" + (f".{j}.text" if isinstance(m.content, list) else "")
                raise ApiError(
                    400,
                    f"{where}: holds {IMAGE_MARKER}, the text that marks where an image goes; in "
                    "a conversation with images it cannot be text (send images as image_url parts)",
                    where,
                )
    calls = message_calls(body, asked)
    return tuple(
        Message(_ROLES.get(m.role, m.role), m.text(IMAGE_MARKER), tuple(b), c, tid)  # type: ignore[arg-type]
        for m, b, (c, tid) in zip(body.messages, images, calls)
    )


def to_turn(body: ChatCompletionRequest) -> ChatTurn:
    refuse_unset(body, CHAT_FIELDS)
    if body.top_logprobs and not body.logprobs:  # 0 asks for nothing
        raise ApiError(400, "top_logprobs: needs logprobs: true", "top_logprobs", "invalid_request")
    if body.jump_forward and body.logprobs:
        raise ApiError(
            400, "jump_forward: a forced token has no log-prob of its own; not with logprobs", "jump_forward"
        )
    kwargs = template_kwargs(body.chat_template_kwargs)
    if kwargs and body.bmoe_logprobs_of:
        raise ApiError(
            400,
            "bmoe_logprobs_of: scored on a decision's prompt, which takes no chat_template_kwargs; not with them",
            "bmoe_logprobs_of",
        )
    asked = tools_asked(body)
    msgs = _messages(body, asked)
    if msgs[-1].role not in ("user", "tool"):
        raise ApiError(
            400,
            f"messages: the last message must come from the user (or a tool), got {msgs[-1].role!r}",
            f"messages.{len(msgs) - 1}.role",
        )
    if (
        body.max_tokens is not None
        and body.max_completion_tokens is not None
        and body.max_tokens != body.max_completion_tokens
    ):
        raise ApiError(400, "max_tokens and max_completion_tokens disagree; give one", "max_completion_tokens")
    schema, grammar = constraint_fields(body)
    if asked.active and (schema is not None or grammar is not None):
        raise ApiError(
            400,
            "tools: an answer keeps one constraint: give tools or a response_format/json_schema/grammar, "
            "not both (or tool_choice 'none')",
            "tools",
            "invalid_request",
        )
    return ChatTurn(
        json_schema=schema,
        grammar=grammar,
        jump_forward=body.jump_forward,
        messages=msgs,
        max_tokens=body.max_tokens or body.max_completion_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stops=body.stop_list(),
        think=body.think,
        reasoning_effort=body.reasoning_effort,
        template_kwargs=kwargs,
        top_logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        logit_bias=body.bias(),
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        logprobs_of=tuple(body.bmoe_logprobs_of or ()),
        tools=asked,
    )


def telemetry(outcome: TurnOutcome) -> dict[str, Any]:
    """BMOE_DONE's keys for the turn, less the texts (the response carries them)."""
    fields = done_fields(outcome.result)
    for k in ("text", "reasoning", "cancelled"):
        fields.pop(k)
    if outcome.logprobs_of is not None:
        fields["logprobs_of"] = outcome.logprobs_of
    if outcome.decision is not None:
        fields["decision"] = outcome.decision
    return fields


def usage(outcome: TurnOutcome) -> dict[str, Any]:
    r = outcome.result
    prompt = r.n_prompt + r.n_reused
    return {
        "prompt_tokens": prompt,
        "completion_tokens": r.n_tokens,
        "total_tokens": prompt + r.n_tokens,
        "prompt_tokens_details": {"cached_tokens": r.n_reused},
    }


def raise_for(ev: Event) -> None:
    if ev.kind != ERROR:
        return
    raise job_error(ev.value, lambda e: from_request_error(e, getattr(e, "field", "messages"))) from ev.value


class ChatRoute:
    def __init__(self, queue: JobQueue, metrics: Metrics, model_id: str) -> None:
        self.queue, self.metrics, self.model_id = queue, metrics, model_id

    def _worker_fn(self, turn: ChatTurn):  # runs in the worker thread
        def fn(session, job: Job) -> TurnOutcome:
            try:
                check_bias(session, turn.logit_bias)
                outcome = answer_turn(session, job, turn)  # a decision where the answer is one of a set
            except ApiError as e:
                if e.status == 499:  # the client left while its conversation was being checked
                    self.metrics.cancelled.inc()
                raise
            if outcome.finish_reason == "cancelled":
                self.metrics.cancelled.inc()
            self.metrics.chat_turn(outcome.result, outcome.finish_reason)
            return outcome

        return fn

    async def __call__(self, body: ChatCompletionRequest, request: Request):
        turn = to_turn(body)
        job = self.queue.submit(self._worker_fn(turn))
        watcher = asyncio.create_task(cancel_on_disconnect(request, job))
        handed_over = False
        try:
            first = await job.next_event()
            raise_for(first)
            cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
            if body.stream:
                include_usage = bool(body.stream_options and body.stream_options.include_usage)
                handed_over = True
                return StreamingResponse(
                    self._sse(first, job, watcher, cid, created, include_usage, bool(body.logprobs)),
                    media_type="text/event-stream",
                    headers=SSE_HEADERS,
                )
            ev = first if first.kind == RESULT else await job.outcome()
            raise_for(ev)
            outcome: TurnOutcome = ev.value
            if outcome.finish_reason == "cancelled":
                return JSONResponse(error_body(499, "the client closed the request", None, "cancelled"), 499)
            message: dict[str, Any] = {"role": "assistant", "content": outcome.text}
            if outcome.tool_calls:  # OpenAI's shape: content null where the answer is only calls
                message["content"] = outcome.text or None
                message["tool_calls"] = call_entries(tuple(enumerate(outcome.tool_calls)), indexed=False)
            if outcome.result.reasoning:
                message["reasoning_content"] = outcome.result.reasoning
            return {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": self.model_id,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": outcome.finish_reason,
                        "logprobs": outcome.logprobs,
                    }
                ],
                "usage": usage(outcome),
                "bmoe": telemetry(outcome),
            }
        finally:
            if not handed_over:
                watcher.cancel()
                if not job.finished:
                    job.cancel()

    def _chunk(
        self, cid: str, created: int, delta: dict[str, Any], finish: str | None, lps: Any = None, **extra: Any
    ) -> str:
        obj = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": self.model_id,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": lps}],
            **extra,
        }
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    async def _sse(
        self,
        first: Event,
        job: Job,
        watcher: asyncio.Task,
        cid: str,
        created: int,
        include_usage: bool,
        logprobs: bool = False,
    ) -> AsyncIterator[str]:
        chunk = partial(self._chunk, cid, created)
        try:
            yield chunk({"role": "assistant", "content": ""}, None)
            ev = first
            while True:
                if ev.kind == ERROR:
                    err = ev.value
                    status = err.status if isinstance(err, ApiError) else 500
                    yield f"data: {json.dumps(error_body(status, str(err)))}\n\n"
                    break
                if ev.kind == RESULT:
                    outcome: TurnOutcome = ev.value
                    if outcome.finish_reason == "cancelled":
                        return
                    yield chunk({}, outcome.finish_reason, bmoe=telemetry(outcome))
                    if include_usage:  # OpenAI's shape: a chunk with no choices, only usage
                        obj = {
                            "id": cid,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": self.model_id,
                            "choices": [],
                            "usage": usage(outcome),
                        }
                        yield f"data: {json.dumps(obj)}\n\n"
                    break
                d: Delta = ev.value
                delta: dict[str, Any] = {}
                if d.reasoning:
                    delta["reasoning_content"] = d.reasoning
                if d.content:
                    delta["content"] = d.content
                if d.calls:
                    delta["tool_calls"] = call_entries(d.calls, indexed=True)
                yield chunk(delta, None, {"content": list(d.logprobs), "refusal": None} if logprobs else None)
                ev = await job.next_event()
            yield "data: [DONE]\n\n"
        finally:  # the client left (or the stream ended): stop generating for nobody
            watcher.cancel()
            if not job.finished:
                job.cancel()
