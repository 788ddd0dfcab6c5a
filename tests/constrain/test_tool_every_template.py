"""Every tool-call template bmoe reads, end to end on a tiny model: the tiny qwen3moe is given the
REAL chat template of each family (the pinned llama.cpp release's models/templates), renders the
tools, writes a call under the format's grammar and ends; the call reads back as the tool it named,
with arguments valid against its schema. At a temperature over 0 the tool's name is a decision
(runtime/tool_choice.py) in every format whose name follows fixed text, after the reasoning block
where the answer starts inside one (Kimi K3, MiniMax M3), and the call made is the one drawn. The
schemas bound every value (enums, booleans, no extra keys), so a random model's
call ends within n_predict whatever it picks."""

from __future__ import annotations

import copy

import jsonschema
import pytest
from test_tool_formats import FAMILIES, PROBED, renderer, template
from test_tool_nested import NAMES, PICK

from bmoe.constrain import Tool, ToolChoice
from bmoe.constrain.tool_parse import parse_tool_calls
from bmoe.session import GenerateRequest, Session, SessionConfig

SCHEMA = copy.deepcopy(PICK.parameters)
SCHEMA["additionalProperties"] = False
SCHEMA["properties"]["opts"]["additionalProperties"] = False
TOOLS = (Tool("pick", "", SCHEMA), Tool("pick_two", "Pick two.", SCHEMA))
TEMPLATES = sorted(set(FAMILIES) | set(PROBED) | set(NAMES))
# Formats whose answer starts inside a reasoning block where the turn reasons; this turn does not
# (think=False sets their templates' switch off, runtime/think_switch.py): no block, the calls at once.
REASONING_FIRST = {"kimi-k3", "minimax-m3"}
# Formats whose call holds a hole before the name (Command R7B's call number, Solar Open's id):
# no name decision (tool_decision returns None), the name comes by constrained generation.
HOLE_BEFORE_NAME = {"command-r7b", "solar-open"}


@pytest.fixture(scope="module")
def session(tiny_models):
    s = Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=2048, n_threads=1, decide=True))
    yield s
    s.close()


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_template_writes_a_call_that_reads_back(session: Session, name: str) -> None:
    session.runtime.chat = renderer(template(name))
    fmt = session.runtime.chat.tool_format
    for temperature in (0.0, 0.8):
        session.set_history([])
        result = session.generate(
            GenerateRequest(
                prompt="Pick.",
                tools=TOOLS,
                tool_choice=ToolChoice("required"),
                parallel_tool_calls=False,
                n_predict=200,
                think=False,
                temperature=temperature,
                seed=3,
                clear_kv=True,
            )
        )
        assert result.stop == "eog", (name, temperature, result.text)
        calls = parse_tool_calls(fmt, result.text, TOOLS).calls
        assert len(calls) == 1 and calls[0].name in ("pick", "pick_two"), (name, result.text)
        jsonschema.validate(calls[0].args(), SCHEMA)
        picked = result.tool_decision
        if fmt.name in REASONING_FIRST:  # no reasoning, and no block closed in the text
            assert result.reasoning == "" and fmt.reasoning[1] not in result.text
        if fmt.name in HOLE_BEFORE_NAME:
            assert picked is None
            continue
        assert picked is not None and picked["choices"] == ["pick", "pick_two"]
        assert picked["chosen"] == ["pick", "pick_two"].index(calls[0].name)
        if temperature == 0.0:
            assert picked["answered_by"] == "greedy_walk"
        else:  # drawn from the decision, then forced in: no token of the name decoded
            assert picked["answered_by"] == "decision" and picked["decoded"] == 0
            assert len(picked["choice_logp"]) == 2
