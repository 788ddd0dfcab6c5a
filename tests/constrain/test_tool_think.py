"""Tool calls after a reasoning block (#36 item 3b): with a template that has a ``<think>`` block
(Qwen3, DeepSeek R1) a turn with tools may reason first, and the grammar allows the block before
the calls; where the prompt opened the block (R1), the answer closes it first."""

from __future__ import annotations

import pytest
from test_tool_formats import CALL, TOOLS, accepts, template

from bmoe.config import SessionConfig
from bmoe.constrain import ToolChoice, tool_constraint
from bmoe.constrain.tool_formats import BY_NAME, write_calls
from bmoe.runtime.chat import ChatRenderer
from bmoe.session import GenerateRequest, Session

HERMES = BY_NAME["hermes"]
THOUGHT = "<think>\nThe user wants the weather.\n</think>\n\n"


@pytest.mark.parametrize("mode", ["required", "auto"])
def test_the_block_may_come_before_the_calls(mode: str) -> None:
    call = write_calls(HERMES, [CALL])
    g = tool_constraint(HERMES, TOOLS, ToolChoice(mode), think="open")
    assert g is not None
    assert accepts(g.grammar, THOUGHT + call) and accepts(g.grammar, call)
    plain = tool_constraint(HERMES, TOOLS, ToolChoice("required"))
    assert plain is not None and not accepts(plain.grammar, THOUGHT + call)


def test_an_opened_block_is_closed_before_the_calls() -> None:
    call = write_calls(HERMES, [CALL])
    g = tool_constraint(HERMES, TOOLS, ToolChoice("required"), think="inside")
    assert g is not None
    assert accepts(g.grammar, "The user wants the weather.\n</think>\n\n" + call)
    assert not accepts(g.grammar, call)  # the block is open: it must close first
    assert not accepts(g.grammar, "a</think>\n\nb</think>\n\n" + call)  # the block ends at its first close


@pytest.fixture()
def session(tiny_models):
    s = Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=1024, n_threads=1))
    yield s
    s.close()


@pytest.mark.parametrize(
    "name, think, opens",
    [
        ("Qwen-Qwen3-0.6B", True, False),  # enable_thinking: the model opens the block itself
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", True, True),  # the prompt opens it
        ("Qwen-Qwen3-0.6B", False, False),
    ],
)
def test_a_turn_with_tools_reasons_first_on_a_thinking_template(session, name, think, opens) -> None:
    rt = session.runtime
    rt.chat = ChatRenderer("template", template(name), "<s>", "</s>")
    req = GenerateRequest(prompt="Weather in Paris?", tools=TOOLS, tool_choice=ToolChoice("required"), think=think)
    turn = rt.prepare(req)
    assert turn.think == think and turn.opens_reasoning == opens and turn.mask is not None
    text = (THOUGHT[len("<think>") :] if opens else THOUGHT) if think else ""
    call = write_calls(rt.chat.tool_format, [CALL])
    for tok in session.model.tokenize(text + call, add_special=False, parse_special=False):
        turn.mask.advance(tok)  # raises where the grammar refuses a token
    assert turn.mask.done() or turn.mask.matcher.is_accepting()
