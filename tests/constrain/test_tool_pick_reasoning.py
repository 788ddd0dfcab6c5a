"""The tool's name as a decision after a reasoning block (#36; runtime/tool_position.py ``Block``):
Qwen3's ``<think>`` (the turn may open it), Kimi K3's and MiniMax M3's blocks that every answer
starts inside (closed at once where the turn does not reason), gpt-oss's analysis channel, Gemma
4's thought channel. The
REAL templates on the tiny qwen3moe. A random tiny model never closes its reasoning, so the
block's tokens are scripted: the turn's sampler returns them first (``Scripted``), then samples as
ever; everything after is the model's, under the grammar.

- temperature 0: the answer is constrained greedy's, the same with the decision run (logprobs),
  watched, and with no name decision at all;
- temperature > 0: the name is drawn from the decision, none of it decoded;
- the name position is after the block and the whitespace after ``</think>``: the choices are
  scored from the answer's body, whole;
- the tiny MoE streamed gives the resident answers and decisions.
"""

from __future__ import annotations

import jsonschema
import pytest
from test_tool_every_template import SCHEMA, TOOLS
from test_tool_formats import renderer, template

import bmoe.runtime.runtime as rtm
from bmoe.constrain import ToolChoice
from bmoe.constrain.tool_parse import parse_tool_calls
from bmoe.runtime.tool_position import Block
from bmoe.session import GenerateRequest, Session, SessionConfig

# What each template's model writes as its reasoning, from the answer's start (K3 and M3 start
# inside their block), through the block's close. Qwen3's body (required) starts with "<": a
# random model would write the blank after </think> forever (the grammar bounds it nowhere).
REASONING = {
    "Qwen-Qwen3-0.6B": "<think>\nCall pick.\n</think>\n\n",
    "Kimi-K3": "Call pick.<|close|>think<|sep|><|open|>response<|sep|>",
    "MiniMax-M3": "Call pick.</mm:think>",
    "openai-gpt-oss-120b": "<|channel|>analysis<|message|>Call pick.<|end|><|start|>assistant",
    "google-gemma-4-31B-it": "<|channel>thought\nCall pick.<channel|>",
}
THOUGHT = {"Qwen-Qwen3-0.6B": "\nCall pick.\n"}


class Scripted(rtm.Sampler):
    """A turn's sampler that returns ``script``'s tokens first (whatever the row says)."""

    script: list[int] = []
    left: list[int] = []

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        Scripted.left = list(Scripted.script)

    def sample(self, logits):
        return Scripted.left.pop(0) if Scripted.left else super().sample(logits)


@pytest.fixture(scope="module")
def session(tiny_models):
    s = Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=2048, n_threads=1, decide=True))
    yield s
    s.close()


@pytest.fixture()
def scripted(monkeypatch):
    monkeypatch.setattr(rtm, "Sampler", Scripted)
    yield
    Scripted.script, Scripted.left = [], []


def _run(s: Session, name: str, think: bool, mode: str = "required", temperature: float = 0.0, **kw):
    s.runtime.chat = renderer(template(name))
    text = REASONING[name] if think else ""
    if think and name == "Qwen-Qwen3-0.6B" and mode == "required":
        text += "<"
    Scripted.script = s.model.tokenize(text, add_special=False, parse_special=False)
    s.set_history([])
    s.runtime.kv.reset()
    return s.generate(
        GenerateRequest(
            prompt="Pick.",
            tools=TOOLS,
            tool_choice=ToolChoice(mode),
            parallel_tool_calls=False,
            n_predict=160,
            think=think,
            temperature=temperature,
            seed=3,
            clear_kv=True,
            **kw,
        )
    )


CASES = [
    ("Qwen-Qwen3-0.6B", True),
    ("Kimi-K3", True),
    ("Kimi-K3", False),
    ("MiniMax-M3", True),
    ("MiniMax-M3", False),
    ("openai-gpt-oss-120b", True),
    ("google-gemma-4-31B-it", True),
]


@pytest.mark.parametrize(("name", "think"), CASES)
def test_the_name_is_a_decision_after_the_reasoning(session, scripted, name, think, monkeypatch) -> None:
    fmt = renderer(template(name)).tool_format
    drawn = _run(session, name, think, temperature=0.8, top_logprobs=0)
    d = drawn.tool_decision
    assert drawn.stop == "eog" and d is not None, (name, drawn.text)
    assert d["answered_by"] == "decision" and d["decoded"] == 0 and len(d["choice_logp"]) == 2
    calls = parse_tool_calls(fmt, drawn.text, TOOLS).calls
    assert [c.name for c in calls] == [("pick", "pick_two")[d["chosen"]]]
    if think:
        assert drawn.reasoning == THOUGHT.get(name, "Call pick.")
    # temperature 0: greedy's answer, whether the decision runs, is watched, or is not there
    decided = _run(session, name, think, top_logprobs=0)
    watched = _run(session, name, think)
    assert decided.tool_decision is not None and decided.tool_decision["answered_by"] == "greedy_walk"
    assert "choice_logp" in decided.tool_decision and "choice_logp" not in (watched.tool_decision or {})
    monkeypatch.setattr(rtm, "name_pick", lambda *a, **k: None)
    plain = _run(session, name, think, top_logprobs=0)
    assert decided.text == watched.text == plain.text and decided.tokens == plain.tokens
    assert decided.reasoning == plain.reasoning and plain.tool_decision is None
    calls = parse_tool_calls(fmt, decided.text, TOOLS).calls
    assert [c.name for c in calls] == [("pick", "pick_two")[decided.tool_decision["chosen"]]]


def test_auto_decides_after_the_think_block_and_its_blank(session, scripted, monkeypatch) -> None:
    """Qwen3 under auto: the reasoning's tokens and the blank after ``</think>`` are taken where
    they come (the position is looked for again after each); the decision that counts is made at
    the body's start, over whole choices (``<tool_call>`` included), and a drawn tool is called."""
    import bmoe.runtime.tool_choice as tc

    name = "Qwen-Qwen3-0.6B"
    greedy = _run(session, name, True, "auto", top_logprobs=0)
    d = greedy.tool_decision
    assert d is not None and d["answered_by"] == "greedy_walk" and greedy.reasoning == THOUGHT[name]
    whole = [
        len(
            session.model.tokenize(
                f'<tool_call>\n{{"name": "{n}", "arguments": ', add_special=False, parse_special=False
            )
        )
        for n in ("pick", "pick_two")
    ]
    assert d["choice_tokens"] == whole
    with monkeypatch.context() as m:
        m.setattr(rtm, "name_pick", lambda *a, **k: None)
        plain = _run(session, name, True, "auto", top_logprobs=0)
    assert (plain.text, plain.tokens, plain.reasoning) == (greedy.text, greedy.tokens, greedy.reasoning)
    draws: list[bool] = []

    def draw(logp, *a):  # text while the reasoning is scripted, then pick_two
        draws.append(bool(Scripted.left))
        return len(logp) - 1 if Scripted.left else 1

    monkeypatch.setattr(tc, "draw_choice", draw)
    drawn = _run(session, name, True, "auto", temperature=0.8, top_logprobs=0)
    d = drawn.tool_decision
    assert d is not None and d["answered_by"] == "decision" and d["decoded"] == 0 and d["chosen"] == 1
    assert draws[0] and not draws[-1] and drawn.reasoning == THOUGHT[name]  # drawn again after the block
    assert drawn.text.startswith('\n\n<tool_call>\n{"name": "pick_two", "arguments": ')
    calls = parse_tool_calls(renderer(template(name)).tool_format, drawn.text, TOOLS).calls
    assert [c.name for c in calls] == ["pick_two"]
    jsonschema.validate(calls[0].args(), SCHEMA)


def test_the_block_s_opening_and_blank_leave_nothing() -> None:
    """``Block``'s rule: at the answer's start a token of the block's opening, and right after
    ``</think>`` whitespace, leave nothing; a token that leaves the choices' shared text does."""
    common = b'<tool_call>\n{"name": "'
    b = Block("open", b"<think>", b"</think>", blank=True)
    assert not b.leaves(b"<", common) and not b.leaves(b"<think>\n", common) and not b.leaves(b"<tool", common)
    assert b.leaves(b"Sure", common)
    b.update(b"<th")
    assert b.phase == "maybe"
    b.update(b"<think>\nhm </think")
    assert b.phase == "in"
    b.update(b"<think>\nhm </think>\n")
    assert b.phase == "blank" and b.base == len(b"<think>\nhm </think>\n")
    at = b"<think>\nhm </think>\n"
    assert not b.leaves(at + b"\n\n", common) and not b.leaves(at + b" <tool", common)
    assert b.leaves(at + b"Hi", common)
    b.update(at + b"<tool")
    assert b.phase == "body" and b.base == len(at)
    no_blank = Block("closed", b"<mm:think>", b"</mm:think>")
    no_blank.update(b"x</mm:think>")
    assert no_blank.phase == "blank" and no_blank.leaves(b"x</mm:think>\n", b"]<]")
    assert Block().phase == "body" and Block("inside").phase == "in"


def test_a_tool_turn_that_reasons_has_a_name_decision(session) -> None:
    """Where the turn reasons first (Qwen3's template, think on) the decision is there, after the block."""
    session.runtime.chat = renderer(template("Qwen-Qwen3-0.6B"))
    req = GenerateRequest(prompt="hi", tools=TOOLS, tool_choice=ToolChoice("required"), think=True)
    turn = session.runtime.prepare(req)
    assert turn.think and turn.pick is not None and turn.pick.block.mode == "open"
    assert turn.pick.block.closing == b"</think>" and turn.pick.block.blank


def test_tiny_moe_streamed_equals_resident(tiny_models, scripted) -> None:
    got = []
    for kw in ({}, {"moe_stream": True, "cache_mb": "auto"}):
        s = Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=2048, n_threads=1, decide=True, **kw))
        try:
            runs = []
            for name, think, temp in (
                ("Qwen-Qwen3-0.6B", True, 0.8),
                ("Qwen-Qwen3-0.6B", True, 0.0),
                ("Kimi-K3", False, 0.8),
            ):
                r = _run(s, name, think, temperature=temp, top_logprobs=0)
                runs.append((r.text, r.reasoning, r.tokens, r.tool_decision))
            got.append(runs)
        finally:
            s.close()
    assert all(d is not None and "choice_logp" in d for *_, d in got[0])
    assert got[0] == got[1]
