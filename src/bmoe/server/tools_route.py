"""Tool calls on /v1/chat/completions (docs/server.md "Tools"): the request's ``tools``,
``tool_choice`` and ``parallel_tool_calls`` and the history's calls checked into records, and the
answer's calls read back as OpenAI's ``tool_calls`` (whole, or as stream deltas).

The policy (formats, grammar, parser) is bmoe.constrain's; each refusal here is a 400 naming the
field, before the job is queued, so the session stays usable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bmoe.constrain import (
    ConstraintError,
    Tool,
    ToolCall,
    ToolCallError,
    ToolChoice,
    ToolFormat,
    ToolStream,
    check_history,
    parse_call,
    parse_choice,
    parse_tools,
)
from bmoe.server.errors import ApiError
from bmoe.server.schemas import ChatCompletionRequest


@dataclass(frozen=True, slots=True)
class ToolsAsked:
    """The request's tools: ``choice`` "none" (or no tools) asks for plain text."""

    tools: tuple[Tool, ...] = ()
    choice: ToolChoice = ToolChoice("none")
    parallel: bool = True

    @property
    def active(self) -> bool:
        """Whether the answer is held to the call syntax and read back for calls."""
        return bool(self.tools) and self.choice.mode != "none"


def _refuse(e: ConstraintError) -> ApiError:
    return ApiError(400, str(e), e.field, "invalid_request")


def tools_asked(body: ChatCompletionRequest) -> ToolsAsked:
    """The request's tool fields, checked (the history's calls: ``message_calls``)."""
    try:
        tools = parse_tools(body.tools)
        choice = parse_choice(body.tool_choice, tools)
        parallel = body.parallel_tool_calls
        if parallel is not None and not isinstance(parallel, bool):
            raise ConstraintError("parallel_tool_calls", f"must be true or false, got {parallel!r}")
    except ConstraintError as e:
        raise _refuse(e) from None
    return ToolsAsked(tools, choice, parallel is not False)


def message_calls(body: ChatCompletionRequest, asked: ToolsAsked) -> list[tuple[tuple[ToolCall, ...], str | None]]:
    """Each message's calls and the call it answers (``tool_call_id``); refuses fields on the
    wrong role and content left out where a message must have some."""
    for i, m in enumerate(body.messages):
        if m.tool_calls and m.role != "assistant":
            raise ApiError(
                400, f"messages[{i}].tool_calls: only an assistant message makes calls", f"messages.{i}.tool_calls"
            )
        if m.role == "tool" and not m.tool_call_id:
            raise ApiError(
                400,
                f"messages[{i}].tool_call_id: a tool message names the call it answers",
                f"messages.{i}.tool_call_id",
            )
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise ApiError(
                400,
                f"messages[{i}].content: required (null only on an assistant turn with tool_calls)",
                f"messages.{i}.content",
            )
    try:
        check_history([m.model_dump() for m in body.messages], asked.tools)
    except ConstraintError as e:
        raise _refuse(e) from None
    return [
        (
            tuple(parse_call(c, asked.tools, f"messages[{i}]") for c in m.tool_calls or ()),
            m.tool_call_id if m.role == "tool" else None,
        )
        for i, m in enumerate(body.messages)
    ]


class CallReader:
    """The answer's text in (as it is released), content and calls out; a pass-through where the
    request asks for no calls."""

    def __init__(self, fmt: ToolFormat, asked: ToolsAsked) -> None:
        self.stream = ToolStream(fmt, asked.tools) if asked.active else None
        self.content = ""

    def feed(self, text: str) -> tuple[str, tuple[tuple[int, ToolCall], ...]]:
        if self.stream is None:
            self.content += text
            return text, ()
        return self._split(self.stream.feed(text) if text else [])

    def finish(self) -> tuple[str, tuple[tuple[int, ToolCall], ...]]:
        """The rest; where the calls do not read (an answer cut inside one), their text is content."""
        if self.stream is None:
            return "", ()
        try:
            return self._split(self.stream.finish())
        except ToolCallError:  # calls read before stay calls; an unread call is text only where none read
            if self.stream.calls:
                return "", ()
            rest = self.stream.buf[self.stream.start :]
            self.content += rest
            return rest, ()

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(self.stream.calls) if self.stream is not None else ()

    def _split(self, events: list[tuple]) -> tuple[str, tuple[tuple[int, ToolCall], ...]]:
        text = "".join(e[1] for e in events if e[0] == "content")
        self.content += text
        return text, tuple((e[1], e[2]) for e in events if e[0] == "call")


def call_entries(calls: tuple[tuple[int, ToolCall], ...], *, indexed: bool) -> list[dict[str, Any]]:
    """OpenAI's ``tool_calls`` entries (a stream delta's carry their ``index``)."""
    return [{"index": i, **c.openai()} if indexed else c.openai() for i, c in calls]
