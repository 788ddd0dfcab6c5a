"""Templates that mark the assistant's tokens with ``{% generation %}`` (LFM2.5, poolside Laguna):
bmoe loads them (it refused them as invalid Jinja), the tag's body renders as it is, and a tiny
model runs a conversation under the real LFM2.5-8B-A1B template."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from bmoe.config import SessionConfig
from bmoe.constrain import Tool, ToolCall
from bmoe.constrain.tool_formats import write_calls
from bmoe.runtime.chat import ChatRenderer, Message
from bmoe.runtime.jinja_env import environment
from bmoe.session import GenerateRequest, Session

TEMPLATES = Path(
    os.environ.get("BMOE_LLAMA_TEMPLATES") or Path(sys.prefix) / "share" / "llama.cpp" / "models" / "templates"
)
TAGGED = ["LFM2.5-8B-A1B", "poolside-Laguna-S-2.1", "poolside-Laguna-XS-2.1", "poolside-Laguna-XS.2"]
CHAT = [Message("user", "Hi"), Message("assistant", "Hello there"), Message("user", "Again")]


def template(name: str) -> str:
    path = TEMPLATES / f"{name}.jinja"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: run scripts/setup.sh --test, or set BMOE_LLAMA_TEMPLATES")
    return path.read_text()


def test_the_tag_renders_its_body_unchanged_in_a_scope_of_its_own() -> None:
    t = environment().from_string(
        "{% set x = 'out' %}[{% generation %}{% set x = 'in' %}{{ x }}-{{ y }}{% endgeneration %}]{{ x }}"
    )
    assert t.render(y=1) == "[in-1]out"


@pytest.mark.parametrize("name", TAGGED)
def test_every_template_with_the_tag_loads_and_renders_the_history_turn(name: str) -> None:
    source = template(name)
    assert re.search(r"\{%-? generation -?%\}", source) and "endgeneration" in source
    r = ChatRenderer("template", source, "<s>", "</s>")
    text = r.render(CHAT, think=False)
    assert text.plain == ("Hi", "Hello there", "Again")  # each message's text found in the markup


def test_lfm25_renders_a_conversation_exactly() -> None:
    r = ChatRenderer("template", template("LFM2.5-8B-A1B"), "<s>", "</s>")
    assert r.think_ctl == "prefill"
    want = (
        "<s><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello there<|im_end|>\n"
        "<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n"
    )
    assert r.render(CHAT, think=True) == want
    assert r.render(CHAT, think=False) == want + "<think>\n\n</think>\n\n"  # think off: an empty block


def test_lfm25_with_tools_renders_calls_in_its_own_syntax() -> None:
    """LFM2.5 writes calls as ``<|tool_call_start|>[name(key='value')]<|tool_call_end|>``: the
    probe finds bmoe's ``lfm2`` format, and the template itself renders the tools, the call and
    its result (docs/server.md "Tools")."""
    r = ChatRenderer("template", template("LFM2.5-8B-A1B"), "<s>", "</s>")
    assert r.tool_format.name == "lfm2"
    tool = Tool("get_weather", "Weather", {"type": "object", "properties": {"city": {"type": "string"}}})
    turns = [
        Message("user", "Weather?"),
        Message("assistant", "", tool_calls=(ToolCall("c1", "get_weather", '{"city": "Paris"}'),)),
        Message("tool", "sunny", tool_call_id="c1"),
    ]
    text = r.render(turns, think=True, tools=[tool])
    assert "<|im_start|>system\nList of tools: [" in text
    assert "<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|><|im_end|>" in text
    assert text.endswith("<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture()
def session(tiny_models):
    s = Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=1024, n_threads=1))
    yield s
    s.close()


def test_a_tiny_model_holds_a_conversation_under_lfm25s_template(session) -> None:
    rt = session.runtime
    rt.chat = ChatRenderer("template", template("LFM2.5-8B-A1B"), "", "")
    first = session.generate(GenerateRequest(prompt="Hi", n_predict=4, think=True, temperature=0.0))
    assert len(first.tokens) + (first.stop == "eog") >= 1
    assert [m.role for m in rt.history] == ["user", "assistant"]
    turn = rt.prepare(GenerateRequest(prompt="Again", n_predict=4, think=True, clear_kv=False))
    want = (
        f"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n{first.text}<|im_end|>\n"
        "<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n"
    )
    assert turn.rendered == want


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("poolside-Laguna-S-2.1", "glm-4.7"), ("poolside-Laguna-XS-2.1", "glm-4.5"), ("poolside-Laguna-XS.2", "glm-4.5")],
)
def test_laguna_writes_a_history_call_in_the_format_bmoe_detects(name: str, fmt: str) -> None:
    r = ChatRenderer("template", template(name), "<s>", "</s>")
    assert r.tool_format.name == fmt
    tool = Tool("get_weather", "Weather", {"type": "object", "properties": {"city": {"type": "string"}}})
    turns = [
        Message("user", "Weather?"),
        Message("assistant", "", tool_calls=(ToolCall("c1", "get_weather", '{"city": "Paris"}'),)),
        Message("tool", "sunny", tool_call_id="c1"),
    ]
    text = r.render(turns, think=False, tools=[tool])
    assert write_calls(r.tool_format, [("get_weather", {"city": "Paris"}, "c1")]) in text
    assert '"name": "get_weather"' in text  # the template lists the tools itself
