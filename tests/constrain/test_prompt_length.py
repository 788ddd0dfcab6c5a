"""``Session.prompt_length`` counts a turn's prompt as ``generate`` renders it (the server sizes
``max_tokens`` and refuses an overlong conversation with it): with the template's reasoning switch,
tools, a reasoning effort, template variables and a constraint (a constrained answer does not
reason first, so a thinking template renders its closed block), on the tiny model given each
family's REAL chat template."""

from __future__ import annotations

import pytest
from test_tool_every_template import TOOLS
from test_tool_formats import renderer, template

from bmoe.constrain import ToolChoice
from bmoe.session import GenerateRequest, Message, Session, SessionConfig

HISTORY = [Message("user", "Hi."), Message("assistant", "Hello.")]
CASES = {
    "plain": {},
    "no reasoning": {"think": False},
    "constrained": {"json_schema": {"enum": ["yes", "no"]}},
    "tools": {"tools": TOOLS, "tool_choice": ToolChoice("required")},
    "tools, no reasoning": {"tools": TOOLS, "think": False},
}


@pytest.fixture(scope="module")
def session(tiny_models):
    s = Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=4096, n_threads=1))
    yield s
    s.close()


@pytest.mark.parametrize("name", ["Qwen-Qwen3-0.6B", "openai-gpt-oss-120b", "google-gemma-4-31B-it", "MiniMax-M3"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_count_is_the_prompt_generate_renders(session: Session, name: str, case: str) -> None:
    session.runtime.chat = renderer(template(name))
    session.set_history(HISTORY)
    req = GenerateRequest(prompt="Is it sunny?", clear_kv=False, **CASES[case])
    turn = session.runtime.prepare(req)
    assert session.prompt_length(req, HISTORY) == len(turn.prompt)
    assert session.history == HISTORY  # counting changed nothing


def test_a_thinking_template_counts_the_closed_block_of_a_constrained_answer(session: Session) -> None:
    session.runtime.chat = renderer(template("Qwen-Qwen3-0.6B"))
    free = GenerateRequest(prompt="Is it sunny?", clear_kv=True)
    held = GenerateRequest(prompt="Is it sunny?", clear_kv=True, json_schema={"enum": ["yes", "no"]})
    # the constrained answer starts at once: its prompt holds the empty <think></think> block
    assert session.prompt_length(held, []) > session.prompt_length(free, [])
