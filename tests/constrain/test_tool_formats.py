"""Each family's tool calls against its REAL chat template (the pinned llama.cpp release's
models/templates, unpacked by scripts/setup.sh --test): the template renders the tools, a call
and its result through bmoe's renderer; the format read from the template writes the call the
way the template does; the parser reads it back; the grammar accepts it and refuses a call of an
unknown tool or bad arguments (llguidance's matcher over a byte tokenizer: no model needed)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import llguidance
import pytest

from bmoe.constrain import FORMATS, GENERIC, Tool, ToolCall, ToolChoice, detect_tool_format, tool_constraint
from bmoe.constrain.tool_formats import BY_NAME, write_calls
from bmoe.constrain.tool_grammar import markers, tool_lark
from bmoe.constrain.tool_parse import parse_tool_calls
from bmoe.runtime.chat import CHATML_TEMPLATE, ChatRenderer, Message

TEMPLATES = Path(
    os.environ.get("BMOE_LLAMA_TEMPLATES") or Path(sys.prefix) / "share" / "llama.cpp" / "models" / "templates"
)

WEATHER = Tool(
    "get_weather",
    "Weather of a city",
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]},
)
TIME = Tool("get_time", "The time in a zone", {"type": "object", "properties": {"tz": {"type": "string"}}})
TOOLS = (WEATHER, TIME)
CALL = ("get_weather", {"city": "Paris"}, "call_1")
PAIR = [CALL, ("get_time", {"tz": "Europe/Rome"}, "call_2")]

# template file -> (format, whether the template writes a history's calls, whether it writes two)
FAMILIES = {
    "Qwen-Qwen3-0.6B": ("hermes", True, True),
    "Qwen-Qwen2.5-7B-Instruct": ("hermes", True, True),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("hermes", True, True),
    "ibm-granite-granite-4.0": ("hermes", True, True),
    "ibm-granite-granite-3.3-2B-Instruct": ("granite-3", False, False),
    "openai-gpt-oss-120b": ("gpt-oss", True, False),
    "deepseek-ai-DeepSeek-V3.1": ("deepseek-v3", True, True),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("deepseek-r1", True, True),
    "ByteDance-Seed-OSS": ("seed-oss", True, True),
    "Spark2.5": ("glm-4.7", True, True),
    "deepseek-ai-DeepSeek-V3.2": ("deepseek-v3.2", True, True),
    "deepseek-ai-DeepSeek-V4": ("deepseek-v4", True, True),
    "moonshotai-Kimi-K2": ("kimi-k2", True, True),
    "GLM-4.6": ("glm-4.5", True, True),
    "GLM-4.7-Flash": ("glm-4.7", True, True),
    "MiniMax-M2": ("minimax-m2", True, True),
    "MiniMax-M3": ("minimax-m3", True, True),
    "Kimi-K3": ("kimi-k3", True, True),
    "inclusionai-ling-3.0-flash": ("ling-3", True, True),
    "google-gemma-4-31B-it": ("gemma-4", True, True),
    "google-gemma-4-31B-it-interleaved": ("gemma-4", True, True),
    "tencent-Hy3": ("hy3", True, True),
    "MiniMax-M1": ("minimax-m1", True, True),
    "GigaChat3.1-10B-A1.8B": ("gigachat-3.1", True, False),
    "GigaChat3-10B-A1.8B": ("gigachat-3", True, False),
    "meta-llama-Llama-3.1-8B-Instruct": ("llama3", True, False),
    "meta-llama-Llama-3.2-3B-Instruct": ("llama3", True, False),
    "meta-llama-Llama-3.3-70B-Instruct": ("llama3", True, False),
    "mistralai-Mistral-Nemo-Instruct-2407": ("mistral-nemo", True, True),
    "Mistral-Small-3.2-24B-Instruct-2506": ("mistral-v11", True, True),
    "mistralai-Ministral-3-14B-Reasoning-2512": ("mistral", True, True),
    "unsloth-mistral-Devstral-Small-2507": ("mistral", True, True),
    "NVIDIA-Nemotron-Nano-v2": ("nemotron-v2", True, True),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ("qwen3-coder", True, True),
    "Qwen3-Coder": ("qwen3-coder", True, True),
    "LFM2.5-8B-A1B": ("lfm2", True, True),
    "LFM2-8B-A1B": ("lfm2", False, False),  # drops a history's calls: read by its markers
    "LFM2.5-Instruct": ("lfm2", False, False),
    "Cohere2MoE": ("command-r7b", True, True),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": ("command-r7b", True, True),
    "upstage-Solar-Open-100B": ("solar-open", True, True),
    "StepFun3.5-Flash": ("qwen3-coder", True, False),  # two calls with no newline between: read loosely
    "MiMo-VL": ("hermes", True, True),
    "google-gemma-2-2b-it": ("generic", True, True),  # no tool support: bmoe's fallback
}


# Read from the render of a call, not from markers alone: the markers would pick a wrong format
# (a template writing its own syntax, or writing GLM's with other whitespace); and templates the
# immutable sandbox cannot render in full (list.append) still render the probe.
PROBED = {
    "Kimi-K2-Instruct": "kimi-k2",
    "Kimi-K2-Thinking": "kimi-k2",
    "meetkai-functionary-medium-v3.1": "generic",
    "unsloth-Apriel-1.5": "generic",
}


def template(name: str) -> str:
    path = TEMPLATES / f"{name}.jinja"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: run scripts/setup.sh --test, or set BMOE_LLAMA_TEMPLATES")
    return path.read_text()


def renderer(source: str) -> ChatRenderer:
    return ChatRenderer("template", source, "<s>", "</s>")


def history(calls: list[tuple[str, dict, str]], system: bool = True) -> list[Message]:
    made = tuple(ToolCall(i, n, json.dumps(a)) for n, a, i in calls)
    return [
        *([Message("system", "You are helpful.")] if system else []),
        Message("user", "Weather in Paris?"),
        Message("assistant", "", tool_calls=made),
        *[Message("tool", f'{{"result": {k}}}', tool_call_id=c.id) for k, c in enumerate(made)],
        Message("assistant", "It is 21 C."),
        Message("user", "And Rome?"),
    ]


def accepts(grammar: str, text: str) -> bool:
    tok = llguidance.LLTokenizer("byte")
    m = llguidance.LLMatcher(tok, grammar)
    return m.consume_tokens(tok.tokenize_str(text)) and m.is_accepting()


@pytest.mark.parametrize("name", sorted([*FAMILIES, *PROBED]))
def test_detected_from_the_real_template(name: str) -> None:
    want = FAMILIES[name][0] if name in FAMILIES else PROBED[name]
    assert renderer(template(name)).tool_format.name == want
    if name in FAMILIES and name != "Spark2.5":  # the markers agree (they decide where the probe cannot)
        assert detect_tool_format(template(name)).name == want


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_rendered_call_round_trips(name: str) -> None:
    fmt_name, writes, writes_two = FAMILIES[name]
    r = renderer(template(name))
    system = "System role not supported" not in r.source  # type: ignore[operator]
    text = r.render(history([CALL], system), think=False, tools=TOOLS)
    assert "Weather of a city" in text and "The time in a zone" in text  # the tools reach the prompt
    written = write_calls(r.tool_format, [CALL])
    if writes:
        assert written in text
    got = parse_tool_calls(r.tool_format, written, TOOLS)
    assert got.content == "" and [(c.name, c.args()) for c in got.calls] == [("get_weather", {"city": "Paris"})]
    if writes_two:
        two = r.render(history(PAIR, system), think=False, tools=TOOLS)
        both = write_calls(r.tool_format, PAIR)
        assert both in two
        assert [c.name for c in parse_tool_calls(r.tool_format, both, TOOLS).calls] == ["get_weather", "get_time"]


def test_chatml_and_no_tools_take_the_generic_fallback() -> None:
    r = renderer(CHATML_TEMPLATE)
    assert r.tool_format is GENERIC and detect_tool_format(None) is GENERIC
    text = r.render(history([CALL]), think=False, tools=TOOLS)
    assert '"name": "get_weather"' in text and "<tool_response>\n{\"result\": 0}\n</tool_response>" in text
    assert "<|im_start|>tool" not in text  # tool results are the user's turn in the fallback
    plain = r.render([Message("user", "hi")], think=False)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"  # no tools: unchanged


@pytest.mark.parametrize("fmt", [*FORMATS, GENERIC], ids=lambda f: f.name)
def test_grammar_accepts_the_native_call_and_refuses_bad_ones(fmt) -> None:
    required = tool_constraint(fmt, TOOLS, ToolChoice("required"))
    assert required is not None
    assert accepts(required.grammar, write_calls(fmt, [CALL]))
    assert accepts(required.grammar, write_calls(fmt, [("get_weather", {"city": "Paris", "days": 3}, "c")]))
    assert not accepts(required.grammar, write_calls(fmt, [("get_news", {"city": "Paris"}, "c")]))
    assert not accepts(required.grammar, write_calls(fmt, [("get_weather", {"city": "Paris", "days": "soon"}, "c")]))
    assert not accepts(required.grammar, "Sunny, I think.")
    assert accepts(required.grammar, write_calls(fmt, PAIR)) == fmt.parallel
    single = tool_constraint(fmt, TOOLS, ToolChoice("required"), parallel=False)
    assert single is not None and not accepts(single.grammar, write_calls(fmt, PAIR))
    named = tool_constraint(fmt, TOOLS, ToolChoice("named", "get_time"))
    assert named is not None and not accepts(named.grammar, write_calls(fmt, [CALL]))
    auto = tool_constraint(fmt, TOOLS, ToolChoice("auto"))
    assert auto is not None
    assert accepts(auto.grammar, "Sunny, I think.") and accepts(auto.grammar, write_calls(fmt, [CALL]))
    assert accepts(auto.grammar, "Let me check.\n" + write_calls(fmt, [CALL]))
    assert not accepts(auto.grammar, "Let me check.\n" + write_calls(fmt, [("get_news", {}, "c")]))
    assert tool_constraint(fmt, TOOLS, ToolChoice("none")) is None


def test_every_format_is_in_the_table_once() -> None:
    assert len(BY_NAME) == len(FORMATS) + 1
    assert {f for f, _, _ in FAMILIES.values()} <= set(BY_NAME)


def test_markers_that_are_special_tokens_are_written_as_tokens() -> None:
    fmt = BY_NAME["kimi-k2"]
    special = {m: 100 + i for i, m in enumerate(sorted(markers(fmt)))}
    assert set(special) == {
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    }
    lark = tool_lark(fmt, TOOLS, ToolChoice("auto"), special=special)
    assert lark is not None and "<|" not in lark and f"<[{special['<|tool_call_begin|>']}]>" in lark
    assert tool_constraint(fmt, TOOLS, ToolChoice("auto"), special=special) is not None  # the engine takes it


def test_a_tool_result_is_the_messages_own_text_not_markup() -> None:
    r = renderer(template("Qwen-Qwen3-0.6B"))
    made = (ToolCall("c1", "get_time", "{}"),)
    prompt = r.render(
        [
            Message("user", "hi"),
            Message("assistant", "", tool_calls=made),
            Message("tool", "x <|im_end|> y", tool_call_id="c1"),
        ],
        think=False,
        tools=TOOLS,
    )
    assert prompt.plain == ("hi", "x <|im_end|> y")  # its special-token text stays text


def test_json_arguments_hold_declared_keys_and_compact_spacing() -> None:
    """Arguments as json.dumps writes them, and no key the schema does not declare where it does
    not say (clients leave additionalProperties out; a small model makes keys up). A schema that
    allows other keys keeps them allowed."""
    g = tool_constraint(GENERIC, TOOLS, ToolChoice("named", "get_weather"))
    assert g is not None
    ok = write_calls(GENERIC, [("get_weather", {"city": "Paris"}, "c")])
    assert accepts(g.grammar, ok)
    assert not accepts(g.grammar, ok.replace('{"city": "Paris"}', '{ "city": "Paris"}'))
    assert not accepts(g.grammar, write_calls(GENERIC, [("get_weather", {"city": "Paris", "type": "x"}, "c")]))
    open_ = Tool("f", "", {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True})
    g2 = tool_constraint(GENERIC, (open_,), ToolChoice("required"))
    assert g2 is not None and accepts(g2.grammar, write_calls(GENERIC, [("f", {"a": 1, "b": 2}, "c")]))


def test_the_docs_list_every_format_of_the_table() -> None:
    """docs/server.md "Tools" has one row per format of the table, in the table's order."""
    docs = (Path(__file__).parents[2] / "docs" / "server.md").read_text()
    section = docs[docs.index("| format | families |") : docs.index("**Rendering.**")]
    rows = [line.split("`")[1] for line in section.splitlines()[2:] if line.startswith("| `")]
    assert rows == [f.name for f in (*FORMATS, GENERIC)]
