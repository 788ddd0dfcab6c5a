"""A chat turn as the worker runs it: OpenAI-style messages onto the session's history.

The OpenAI API sends the whole conversation every time. When everything before the last user
message equals the session's history, the turn simply continues the session (its KV prefix is
reused); otherwise the session's history is replaced first. Context checks run before anything
in the session changes, so a refused turn leaves it as it was.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

from bmoe.constrain import ToolCall
from bmoe.errors import ContextOverflowError
from bmoe.server.errors import ApiError
from bmoe.server.job_queue import STEP, Job
from bmoe.server.logprobs import LogprobsCollector, logprobs_of
from bmoe.server.stops import StopMatcher
from bmoe.server.think_fields import Reasoning, resolve
from bmoe.server.tools_route import CallReader, ToolsAsked
from bmoe.session import GenerateRequest, GenerateResult, Message, Session


@dataclass(frozen=True, slots=True)
class ChatTurn:
    messages: tuple[Message, ...]  # the last one is the user's new message
    max_tokens: int | None  # None: the session's n_predict, capped to what the context holds
    temperature: float | None
    top_p: float | None
    seed: int | None
    stops: tuple[str, ...]
    think: bool | None
    json_schema: dict | bool | None = None  # the answer's constraint (at most one of the two)
    grammar: str | None = None
    jump_forward: bool = False  # the constraint's forced tokens in one batch (docs/protocol.md)
    top_logprobs: int | None = None  # None: no log-probs; else alternatives per token (0..20)
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0  # OpenAI's penalties (runtime/sampling.py Sampler)
    frequency_penalty: float = 0.0
    logprobs_of: tuple[str, ...] = ()  # bmoe_logprobs_of (server/logprobs.py)
    tools: ToolsAsked = ToolsAsked()  # tools, tool_choice, parallel_tool_calls (tools_route.py)
    # OpenAI's reasoning_effort and the chat_template_kwargs (checked), read against the
    # template's switch when the turn runs (server/think_fields.py)
    reasoning_effort: Any = None
    template_kwargs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class Delta:
    content: str
    reasoning: str
    logprobs: tuple[dict, ...] = ()  # the logprobs.content entries of the tokens since the last Delta
    calls: tuple[tuple[int, ToolCall], ...] = ()  # tool calls read whole since the last Delta, by index


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    result: GenerateResult
    text: str  # the answer as the client saw it (cut at a stop string)
    finish_reason: str  # "stop" | "length" | "cancelled" | "tool_calls"
    logprobs: dict | None = None  # choices[0].logprobs
    logprobs_of: list[dict] | None = None  # bmoe.logprobs_of
    tool_calls: tuple[ToolCall, ...] = ()  # the answer's calls (``text`` is the content before them)
    # bmoe.decision: a finite-set answer's decision (server/choice_answer.py), or a tool turn's
    # name decision ("kind": "tool", runtime/tool_choice.py)
    decision: dict | None = None


def reasoning_of(session: Session, turn: ChatTurn) -> Reasoning:
    """The turn's think, the template's effort value and the client's template variables."""
    chat = session.chat
    reasons = chat.think_ctl != "none" or chat.reasoning is not None or chat.switch.var is not None
    return resolve(chat.switch, reasons, turn.think, turn.reasoning_effort, turn.template_kwargs)


def _n_predict(session: Session, turn: ChatTurn, req: GenerateRequest) -> int:
    """Tokens to generate, or ApiError(400) when the conversation cannot fit the context: the
    prompt counted as the session renders ``req`` after the turn's earlier messages."""
    n_prompt = session.prompt_length(req, turn.messages[:-1])
    room = session.n_ctx - n_prompt
    if turn.max_tokens is not None:
        if turn.max_tokens > room:
            raise ApiError(
                400,
                f"the conversation ({n_prompt} tokens) plus max_tokens ({turn.max_tokens}) "
                f"exceeds the context (n_ctx {session.n_ctx})",
                "max_tokens",
                "context_length_exceeded",
            )
        return turn.max_tokens
    if room < 1:
        raise ApiError(
            400,
            f"the conversation ({n_prompt} tokens) does not fit the context (n_ctx {session.n_ctx})",
            "messages",
            "context_length_exceeded",
        )
    return min(session.config.n_predict, room)


def run_turn(session: Session, job: Job, turn: ChatTurn) -> TurnOutcome:
    """Worker side: check, align the history, generate; emits a Delta per released piece."""
    r = reasoning_of(session, turn)
    prior, user = list(turn.messages[:-1]), turn.messages[-1]
    req = GenerateRequest(
        prompt=user.content,
        images=user.images,
        tool_call_id=user.tool_call_id,
        tools=turn.tools.tools,
        tool_choice=turn.tools.choice,
        parallel_tool_calls=turn.tools.parallel,
        think=session.config.think if r.think is None else r.think,
        reasoning_effort=r.effort,
        template_vars=r.template_vars,
        clear_kv=False,
        temperature=turn.temperature,
        top_p=turn.top_p,
        seed=turn.seed,
        json_schema=turn.json_schema,
        grammar=turn.grammar,
        jump_forward=turn.jump_forward,
        top_logprobs=turn.top_logprobs,
        logit_bias=turn.logit_bias,
        presence_penalty=turn.presence_penalty,
        frequency_penalty=turn.frequency_penalty,
    )
    try:
        req = dataclasses.replace(req, n_predict=_n_predict(session, turn, req))
    except ContextOverflowError as e:
        raise ApiError(400, str(e), "messages", "context_length_exceeded") from e
    if job.cancelled.is_set():
        raise ApiError(499, "the client closed the request", None, "cancelled")
    of = logprobs_of(session, turn.messages, turn.logprobs_of) if turn.logprobs_of else None
    if prior != session.history:
        session.set_history(prior)
    cancel = threading.Event()  # this turn's own: set before it starts, it still takes effect
    it = session.generate_iter(req, cancel=cancel)
    stops = StopMatcher(turn.stops)
    reader = CallReader(session.chat.tool_format, turn.tools)
    lps = LogprobsCollector(session, turn.top_logprobs is not None)
    while True:
        if job.cancelled.is_set():
            cancel.set()  # before the first token too: the turn then stops before its prefill
        try:
            step = next(it)
        except StopIteration as done:
            result: GenerateResult = done.value
            break
        lps.add(step)
        out, calls = reader.feed(stops.push(step.delta_text))
        if stops.hit:
            session.cancel()
        if out or calls or step.delta_reasoning:
            job.emit(STEP, Delta(out, step.delta_reasoning, lps.take(), calls))
    out, calls = reader.feed(stops.finish())  # what the stop matcher held back, a stop string's possible start
    more, more_calls = reader.finish()
    out, calls, rest = out + more, calls + more_calls, lps.take()
    if out or rest or calls:
        job.emit(STEP, Delta(out, "", rest, calls))
    answer, made = reader.content, reader.calls
    if stops.hit or (made and not result.cancelled):
        # Cancelling rolled the turn back; keep it in the history as the client saw it (calls as calls).
        session.set_history(prior + [user, Message("assistant", answer, tool_calls=made)])
    picked = result.tool_decision  # the tool's name as a decision (runtime/tool_choice.py)
    if result.cancelled and not stops.hit:
        return TurnOutcome(result, answer, "cancelled", lps.answer(), of, decision=picked)
    reason = "stop" if stops.hit or result.stop == "eog" else "length"
    finish = "tool_calls" if made and reason == "stop" else reason
    return TurnOutcome(result, answer, finish, lps.answer(), of, made, picked)
