"""Bad ``tools``, ``tool_choice`` and history tool calls are refused with one message naming the
field (#36 "Bad input"); good ones become records."""

from __future__ import annotations

import pytest

from bmoe.constrain import (
    MAX_TOOLS,
    ConstraintError,
    Tool,
    ToolCall,
    ToolChoice,
    check_history,
    parse_choice,
    parse_tools,
)
from bmoe.runtime.chat import Message


def fn(name: str, **extra: object) -> dict:
    return {"type": "function", "function": {"name": name, **extra}}


TOOLS = parse_tools(
    [fn("get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}}), fn("noop")]
)


def refused(call, message: str) -> None:
    with pytest.raises(ConstraintError) as e:
        call()
    assert str(e.value) == message


def test_good_tools_and_choices() -> None:
    assert [t.name for t in TOOLS] == ["get_weather", "noop"]
    # a description left out renders as an empty one (templates add it to strings)
    noop = {"name": "noop", "description": "", "parameters": {"type": "object"}}
    assert TOOLS[1].openai() == {"type": "function", "function": noop}
    assert parse_tools(None) == () and parse_tools([]) == ()
    assert parse_choice(None, TOOLS) == ToolChoice("auto") and parse_choice(None, ()) == ToolChoice("none")
    assert parse_choice("required", TOOLS) == ToolChoice("required")
    named = {"type": "function", "function": {"name": "noop"}}
    assert parse_choice(named, TOOLS) == ToolChoice("named", "noop")
    assert len(parse_tools([fn(f"t{i}") for i in range(MAX_TOOLS)])) == MAX_TOOLS


BAD_TOOLS = [
    ([fn("a"), fn("b"), fn("a")], "tools[2].function.name: duplicate tool name 'a' (also tools[0])"),
    ([fn(f"t{i}") for i in range(1000)], "tools: holds 1000 tools, more than the 128 one request may hold"),
    ([fn("bad name")], "tools[0].function.name: must be 1 to 64 letters, digits, '_' or '-', got 'bad name'"),
    ([{"type": "retrieval"}], "tools[0]: must be {'type': 'function', 'function': {'name': ..., 'parameters': ...}}"),
    ({"a": 1}, "tools: must be a list of {'type': 'function', 'function': {...}} objects"),
    ([fn("a", parameters={"type": "array"})], "tools[0].function.parameters: must be an object schema (type 'object')"),
    (
        [fn("a", parameters={"type": "object", "not": {}})],
        "tools[0].function.parameters: keyword 'not' at / is not supported (bmoe would not enforce it, so it refuses it)",
    ),
]


@pytest.mark.parametrize(("tools", "message"), BAD_TOOLS)
def test_bad_tools_are_refused_by_name(tools, message: str) -> None:
    refused(lambda: parse_tools(tools), message)


BAD_CHOICES = [
    (
        {"type": "function", "function": {"name": "get_news"}},
        "tool_choice.function.name: 'get_news' is not one of the tools ('get_weather', 'noop')",
    ),
    ("sometimes", "tool_choice: must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}"),
]


@pytest.mark.parametrize(("choice", "message"), BAD_CHOICES)
def test_bad_tool_choice_is_refused_by_name(choice, message: str) -> None:
    refused(lambda: parse_choice(choice, TOOLS), message)


def test_required_without_tools_is_refused() -> None:
    refused(lambda: parse_choice("required", ()), "tool_choice: 'required' needs at least one tool in tools")


def call(name: str, args: str = "{}", cid: str = "c1") -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


BAD_HISTORY = [
    (
        [{"role": "assistant", "tool_calls": [call("get_news")]}],
        "messages[0].tool_calls[0].function.name: 'get_news' is not one of the tools ('get_weather', 'noop')",
    ),
    (
        [{"role": "user"}, {"role": "assistant", "tool_calls": [call("noop"), call("noop", "[1]")]}],
        "messages[1].tool_calls[1].function.arguments: must be a JSON object (as text)",
    ),
    (
        [{"role": "assistant", "tool_calls": [call("noop")]}, {"role": "tool", "tool_call_id": "c9", "content": "x"}],
        "messages[1].tool_call_id: 'c9' answers no earlier assistant tool call",
    ),
    (
        [{"role": "assistant", "tool_calls": [call("noop", cid="")]}],
        "messages[0].tool_calls[0].id: must be a non-empty string",
    ),
]


@pytest.mark.parametrize(("history", "message"), BAD_HISTORY)
def test_history_calls_that_do_not_match_the_tools_are_refused(history, message: str) -> None:
    refused(lambda: check_history(history, TOOLS), message)


def test_history_of_records_is_checked_the_same_way() -> None:
    good = [
        Message("assistant", "", tool_calls=(ToolCall("c1", "get_weather", '{"city": "Oslo"}'),)),
        Message("tool", "5 C", tool_call_id="c1"),
    ]
    check_history(good, TOOLS)
    bad = [Message("assistant", "", tool_calls=(ToolCall("c1", "get_weather", "{}"),))]
    refused(
        lambda: check_history(bad, [Tool("noop")]),
        "messages[0].tool_calls[0].function.name: 'get_weather' is not one of the tools ('noop')",
    )
