"""The formats added for the MoE families that were on the generic fallback: LFM2's Python calls
(keyword arguments as Python literals, read with ``ast``, never evaluated), Command R7B / Cohere2
MoE (a call number before the name) and Solar Open (a call id before the name)."""

from __future__ import annotations

import pytest
from test_tool_formats import TOOLS, accepts

from bmoe.constrain import Tool, ToolChoice, ToolStream, parse_tool_calls, tool_constraint
from bmoe.constrain.tool_decision import tool_decision
from bmoe.constrain.tool_formats import BY_NAME, native_id, write_calls
from bmoe.constrain.tool_grammar import markers, tool_lark
from bmoe.constrain.tool_parse import ToolCallError

LFM2 = BY_NAME["lfm2"]
NOTE = Tool("note", "", {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})


def test_lfm2_writes_repr_literals_and_reads_them_back() -> None:
    args = {"text": "it's \"quoted\"\nand \\ slashed", "n": -2, "x": 1.5, "ok": False, "none": None}
    written = write_calls(LFM2, [("f", args, "c")])
    assert written == (
        "<|tool_call_start|>[f(text='it\\'s \"quoted\"\\nand \\\\ slashed', n=-2, x=1.5, ok=False, none=None)]"
        "<|tool_call_end|>"
    )
    assert parse_tool_calls(LFM2, written).calls[0].args() == args


def test_lfm2_reads_json_words_double_quotes_and_loose_spacing() -> None:
    text = "Let me see. <|tool_call_start|>[ get_weather( city = \"Paris\" , days=3, ), get_time(tz={'a': true}) ]<|tool_call_end|>"
    got = parse_tool_calls(LFM2, text)
    assert got.content == "Let me see."
    assert [(c.name, c.args()) for c in got.calls] == [
        ("get_weather", {"city": "Paris", "days": 3}),
        ("get_time", {"tz": {"a": True}}),
    ]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            "city=open('/etc/passwd')",
            "tool call 1 (get_weather): its argument 'city' holds \"open('/etc/passwd')\", which is not a literal",
        ),
        ("city=1 + 2", "tool call 1 (get_weather): its argument 'city' holds '1 + 2', which is not a literal"),
        ("'Paris'", "tool call 1 (get_weather): expected a keyword argument (key=value) at \"'Paris')]<|tool_call\""),
        ("city='a' days=3", "tool call 1 (get_weather): its argument 'city' is not a Python literal: \"'a' days=3\""),
        ("city=[1, 2)", "tool call 1 (get_weather): unbalanced ')' at '))]<|tool_call_end|>'"),
    ],
)
def test_lfm2_refuses_what_is_not_a_literal_by_name(args: str, message: str) -> None:
    with pytest.raises(ToolCallError) as e:
        parse_tool_calls(LFM2, f"<|tool_call_start|>[get_weather({args})]<|tool_call_end|>", TOOLS)
    assert str(e.value) == message


def test_lfm2_streamed_call_is_sent_once_whole() -> None:
    text = "<|tool_call_start|>[note(text='a, (b) [c]'), note(text=\"d')\")]<|tool_call_end|>"
    stream = ToolStream(LFM2, (NOTE,))
    deltas = [d for k in range(len(text)) for d in stream.feed(text[k])] + stream.finish()
    assert [d[2].args() for d in deltas if d[0] == "call"] == [{"text": "a, (b) [c]"}, {"text": "d')"}]
    assert not [d for d in deltas if d[0] == "content"]


def test_lfm2_grammar_holds_python_literals() -> None:
    g = tool_constraint(LFM2, (NOTE, *TOOLS), ToolChoice("required"))
    assert g is not None
    assert accepts(g.grammar, "<|tool_call_start|>[note(text='a\\'b')]<|tool_call_end|>")
    assert accepts(g.grammar, '<|tool_call_start|>[note(text="a\'b")]<|tool_call_end|>')
    assert not accepts(g.grammar, "<|tool_call_start|>[note(text=open('x'))]<|tool_call_end|>")
    assert not accepts(g.grammar, "<|tool_call_start|>[note(text='a\nb')]<|tool_call_end|>")  # a raw line break
    assert not accepts(g.grammar, "<|tool_call_start|>[note(text='a', more=1)]<|tool_call_end|>")
    assert not accepts(g.grammar, "<|tool_call_start|>[note()]<|tool_call_end|>")  # required text left out
    flag = Tool("f", "", {"type": "object", "properties": {"on": {"type": "boolean"}, "x": {"type": "null"}}})
    g2 = tool_constraint(LFM2, (flag,), ToolChoice("required"))
    assert g2 is not None and accepts(g2.grammar, write_calls(LFM2, [("f", {"on": True, "x": None}, "c")]))
    assert not accepts(g2.grammar, "<|tool_call_start|>[f(on=true)]<|tool_call_end|>")


def test_command_r7b_reads_call_numbers_that_go_on_from_the_history() -> None:
    fmt = BY_NAME["command-r7b"]
    text = (
        '<|START_ACTION|>[\n    {"tool_call_id": "3", "tool_name": "get_weather", "parameters": {"city": "Oslo"}},'
        '\n    {"tool_call_id": "4", "tool_name": "get_time", "parameters": {}}\n]<|END_ACTION|>'
    )
    got = parse_tool_calls(fmt, text, TOOLS)
    assert [(c.name, c.args()) for c in got.calls] == [("get_weather", {"city": "Oslo"}), ("get_time", {})]
    g = tool_constraint(fmt, TOOLS, ToolChoice("required"))
    assert g is not None and accepts(g.grammar, text)


def test_solar_open_ids_are_ten_lowercase_characters_and_text_opens_with_content() -> None:
    fmt = BY_NAME["solar-open"]
    assert native_id(fmt, "call_1") == native_id(fmt, "call_1") and len(native_id(fmt, "call_1")) == 10
    assert native_id(fmt, "call_1").isalnum() and native_id(fmt, "call_1").islower()
    assert native_id(fmt, "a1b2c3d4e5") == "a1b2c3d4e5"
    assert native_id(BY_NAME["mistral-v11"], "call_1") == "74196Fe72"  # Mistral's unchanged
    text = '<|tool_calls|><|tool_call:begin|>a1b2c3d4e5<|tool_call:name|>get_time<|tool_call:args|>{"tz": "UTC"}<|tool_call:end|><|calls|>'
    got = parse_tool_calls(fmt, text, TOOLS)
    assert [(c.id, c.name, c.args()) for c in got.calls] == [("a1b2c3d4e5", "get_time", {"tz": "UTC"})]
    assert parse_tool_calls(fmt, "<|content|>Sunny.", TOOLS).content == "Sunny."
    auto = tool_constraint(fmt, TOOLS, ToolChoice("auto"))
    assert auto is not None and accepts(auto.grammar, "<|content|>Sunny.") and accepts(auto.grammar, text)


@pytest.mark.parametrize("name", ["command-r7b", "solar-open"])
def test_a_hole_before_the_name_means_no_name_decision(name: str) -> None:
    assert tool_decision(BY_NAME[name], TOOLS, ToolChoice("required")) is None
    d = tool_decision(LFM2, TOOLS, ToolChoice("required"))
    assert d is not None and d.forced == "<|tool_call_start|>[" and d.choices == ("get_weather(", "get_time(")


def test_gigachat_3_calls_as_its_own_role_and_its_markers_keep_their_line_breaks() -> None:
    fmt = BY_NAME["gigachat-3"]
    text = 'Checking.<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "get_time", "arguments": {"tz": "UTC"}}'
    got = parse_tool_calls(fmt, text, TOOLS)
    assert got.content == "Checking." and [(c.name, c.args()) for c in got.calls] == [("get_time", {"tz": "UTC"})]
    assert {"<|message_sep|>\n\n", "<|role_sep|>\n", "<|message_sep|>", "<|role_sep|>"} == markers(fmt)
    special = {"<|message_sep|>\n\n": 7, "<|role_sep|>\n": 8}
    lark = tool_lark(fmt, TOOLS, ToolChoice("required"), special=special)
    assert lark is not None and "<[7]>" in lark and "<[8]>" in lark and "message_sep" not in lark
