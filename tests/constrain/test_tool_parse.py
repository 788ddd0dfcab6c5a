"""Model output in each format read back into OpenAI tool_calls: one call, parallel calls, text
before the calls, whitespace as models write it, streamed deltas, and malformed calls refused
with a message naming the call and what was wrong."""

from __future__ import annotations

import pytest

from bmoe.constrain import (
    FORMATS,
    GENERIC,
    Tool,
    ToolCallError,
    ToolChoice,
    ToolStream,
    parse_tool_calls,
    tool_decision,
)
from bmoe.constrain.tool_formats import BY_NAME, write_calls

WEATHER = Tool(
    "get_weather",
    "",
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]},
)
TIME = Tool("get_time", "", {"type": "object", "properties": {"tz": {"type": "string"}}})
TOOLS = (WEATHER, TIME)
ONE = [("get_weather", {"city": "Paris", "days": 2}, "call_1")]
TWO = [*ONE, ("get_time", {"tz": "UTC"}, "call_2")]
ALL = [*FORMATS, GENERIC]


def named(calls) -> list[tuple[str, dict]]:
    return [(c.name, c.args()) for c in calls]


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_single_parallel_and_text_before(fmt) -> None:
    got = parse_tool_calls(fmt, write_calls(fmt, ONE), TOOLS)
    assert got.content == "" and named(got.calls) == [("get_weather", {"city": "Paris", "days": 2})]
    if fmt.parallel:
        got = parse_tool_calls(fmt, write_calls(fmt, TWO), TOOLS)
        assert named(got.calls) == [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"tz": "UTC"})]
        assert len({c.id for c in got.calls}) == 2
    got = parse_tool_calls(fmt, "Let me look.\n\n" + write_calls(fmt, ONE), TOOLS)
    assert got.content == "Let me look." and len(got.calls) == 1
    plain = parse_tool_calls(fmt, "  It is sunny.\n", TOOLS)
    assert plain.content == "  It is sunny.\n" and plain.calls == []


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_streamed_deltas_give_what_a_whole_parse_gives(fmt) -> None:
    text = "Let me look.\n" + write_calls(fmt, TWO if fmt.parallel else ONE)
    ids = iter(f"id{i}" for i in range(10))
    stream = ToolStream(fmt, TOOLS, make_id=lambda: next(ids))
    deltas: list[tuple] = []
    for k in range(0, len(text), 3):
        deltas += stream.feed(text[k : k + 3])
    deltas += stream.finish()
    content = "".join(d[1] for d in deltas if d[0] == "content")
    calls = [d[2] for d in deltas if d[0] == "call"]
    assert content == "Let me look."
    assert [d[1] for d in deltas if d[0] == "call"] == list(range(len(calls)))
    assert named(calls) == named(parse_tool_calls(fmt, text, TOOLS).calls)
    if fmt.name not in ("kimi-k2", "mistral-v11", "mistral-nemo", "solar-open"):  # those write their own ids
        assert [c.id for c in calls] == [f"id{i}" for i in range(len(calls))]


def test_a_stream_without_calls_passes_its_text_on() -> None:
    stream = ToolStream(BY_NAME["hermes"], TOOLS)
    out = stream.feed("Hello <tool") + stream.feed("s are fun") + stream.finish()
    assert "".join(d[1] for d in out) == "Hello <tools are fun"


def test_whitespace_as_models_write_it() -> None:
    hermes = BY_NAME["hermes"]
    got = parse_tool_calls(hermes, '<tool_call>{"name":"get_weather","arguments":{"city":"Oslo"}}</tool_call>', TOOLS)
    assert named(got.calls) == [("get_weather", {"city": "Oslo"})]
    coder = BY_NAME["qwen3-coder"]
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan\nJose\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    assert named(parse_tool_calls(coder, text, TOOLS).calls) == [("get_weather", {"city": "San\nJose", "days": 3})]
    oss = BY_NAME["gpt-oss"]
    text = '<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Oslo"}<|call|>'
    got = parse_tool_calls(oss, text, TOOLS)
    assert named(got.calls) == [("get_weather", {"city": "Oslo"})]
    kimi = parse_tool_calls(
        BY_NAME["kimi-k2"], write_calls(BY_NAME["kimi-k2"], [("get_time", {}, ""), ("get_time", {}, "")]), TOOLS
    )
    assert [c.id for c in kimi.calls] == ["functions.get_time:0", "functions.get_time:1"]


MALFORMED = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>',
     "tool call 1 (get_weather): its arguments are not JSON (Expecting value at 'Paris}}\\n</tool_call>')"),
    ("hermes", '<tool_call>\n{"name": "get_news", "arguments": {}}\n</tool_call>',
     "tool call 1 names 'get_news', which is not one of the tools"),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
     "tool call 1 (get_weather): the answer ends inside its arguments"),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": ["Paris"]}\n</tool_call>',
     "tool call 1 (get_weather): its arguments are not a JSON object"),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call> and more',
     "unexpected text after the tool calls: 'and more'"),
    ("hermes", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}",
     "tool call 1 (get_weather): expected '}\\n</tool_call>' after its arguments"),
    ("kimi-k2", '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{}<|tool_call_end|>',
     "the tool calls do not end with '<|tool_calls_section_end|>'"),
    ("deepseek-v3.2", '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="days" string="false">two</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
     "tool call 1 (get_weather): its value 'two' is marked not a string but is not JSON"),
    ("llama3", '{"name": "get_weather", "parameters": {}}{"name": "get_time", "parameters": {}}',
     "unexpected text after the tool calls: '{\"name\": \"get_time\", \"parameters\": {}}'"),
    ("nemotron-v2", "<TOOLCALL>[]</TOOLCALL>", "the tool calls begin ('<TOOLCALL>[') but no call reads after it"),
]  # fmt: skip


@pytest.mark.parametrize(("fmt", "text", "message"), MALFORMED)
def test_malformed_calls_are_refused_by_name(fmt: str, text: str, message: str) -> None:
    with pytest.raises(ToolCallError) as e:
        parse_tool_calls(BY_NAME[fmt], text, TOOLS)
    assert str(e.value) == message


# no decision where the model writes a hole before the name (test_tool_python)
@pytest.mark.parametrize("fmt", [f for f in ALL if f.name not in ("command-r7b", "solar-open")], ids=lambda f: f.name)
def test_the_choice_of_tool_is_a_decision_over_what_the_model_writes(fmt) -> None:
    tools = (Tool("get"), WEATHER, TIME)
    required = tool_decision(fmt, tools, ToolChoice("required"))
    assert required is not None and required.names == ("get", "get_weather", "get_time")
    for name, chosen in zip(required.names, required.choices):
        written = write_calls(fmt, [(name, {}, "abcDE1234")])
        assert written.startswith(required.forced + chosen)  # the model's own text, in order
        assert parse_tool_calls(fmt, written, tools).calls[0].name == name
    assert not any(a != b and b.startswith(a) for a in required.choices for b in required.choices)
    auto = tool_decision(fmt, tools, ToolChoice("auto"))
    assert auto is not None and auto.text_outside and auto.forced == ""
    assert auto.choices == tuple(required.forced + c for c in required.choices)
    named = tool_decision(fmt, tools, ToolChoice("named", "get_time"))
    assert named is not None and named.choices == () and named.forced == required.forced + required.choices[2]
    assert tool_decision(fmt, tools, ToolChoice("none")) is None
