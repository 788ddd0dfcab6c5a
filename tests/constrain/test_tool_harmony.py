"""gpt-oss (harmony): the analysis channel before a call (#36 item 3), against the REAL template.
The grammar allows ``<|channel|>analysis<|message|>...<|end|><|start|>assistant`` before the
call where the turn reasons, the output splits it off as reasoning, and the text left is the
call as the template writes it after the same analysis. Also: a format's markers that are
control tokens of the vocabulary are written into the output text (llama.cpp leaves control
tokens out of a token's text), so the calls read. And the other formats' own blocks: Gemma 4's
thought channel, and MiniMax M3's and Kimi K3's, which every answer starts inside."""

from __future__ import annotations

import json

import pytest
from test_tool_formats import CALL, TOOLS, accepts, renderer, template

from bmoe.config import SessionConfig
from bmoe.constrain import Tool, ToolChoice, ToolStream, parse_tool_calls, tool_constraint
from bmoe.constrain.tool_formats import BY_NAME, ToolFormat, write_calls
from bmoe.runtime.chat import _environment
from bmoe.runtime.detokenize import Detokenizer
from bmoe.runtime.tool_turn import reasoning_markers, reasoning_split, thinks
from bmoe.session import GenerateRequest, Message, Session

OSS = BY_NAME["gpt-oss"]
THOUGHT = "The user wants the weather; call get_weather."
ANALYSIS = OSS.reasoning[0] + THOUGHT + OSS.reasoning[1]


def test_the_template_writes_the_analysis_then_the_call_as_the_format_does() -> None:
    name, args, cid = CALL
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "thinking": THOUGHT,
            "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}],
        },
        {"role": "tool", "tool_call_id": cid, "content": "sunny"},
    ]
    text = (
        _environment()
        .from_string(template("openai-gpt-oss-120b"))
        .render(messages=messages, tools=[t.openai() for t in TOOLS], add_generation_prompt=True)
    )
    # the generation prompt is "<|start|>assistant": what the model writes after it
    assert "<|start|>assistant" + ANALYSIS + write_calls(OSS, [CALL]) in text


@pytest.mark.parametrize("mode", ["required", "auto"])
def test_the_grammar_allows_the_analysis_before_the_call_where_the_turn_reasons(mode: str) -> None:
    call = write_calls(OSS, [CALL])
    g = tool_constraint(OSS, TOOLS, ToolChoice(mode), think="open")
    assert g is not None
    assert accepts(g.grammar, ANALYSIS + call) and accepts(g.grammar, call)
    assert not accepts(g.grammar, ANALYSIS + write_calls(OSS, [("get_news", {}, "c")]))
    plain = tool_constraint(OSS, TOOLS, ToolChoice("required"))  # a turn that does not reason
    assert plain is not None and not accepts(plain.grammar, ANALYSIS + call)


def test_the_analysis_is_read_out_as_reasoning_and_the_rest_is_the_call() -> None:
    r = renderer(template("openai-gpt-oss-120b"))
    req = GenerateRequest(prompt="Weather?", tools=TOOLS, tool_choice=ToolChoice("required"))
    assert r.think_ctl == "none" and thinks(r, req)
    marks = reasoning_markers(r, req)
    assert marks == OSS.reasoning
    assert reasoning_markers(r, GenerateRequest(prompt="Weather?")) == marks  # no calls: the same channel
    call = write_calls(OSS, [CALL])
    d = Detokenizer(split_think=True, markers=marks)
    out = ANALYSIS + call
    for k in range(0, len(out), 4):
        d.push(out[k : k + 4].encode())
    d.finish()
    assert d.reasoning == THOUGHT and d.text == call
    got = parse_tool_calls(OSS, d.text, TOOLS)
    assert [(c.name, c.args()) for c in got.calls] == [("get_weather", {"city": "Paris"})]


@pytest.fixture()
def session(tiny_models):
    s = Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=1024, n_threads=1))
    yield s
    s.close()


def test_a_reasoning_gpt_oss_turn_takes_the_analysis_then_the_call_token_by_token(session) -> None:
    rt = session.runtime
    rt.chat = renderer(template("openai-gpt-oss-120b"))
    req = GenerateRequest(prompt="Weather in Paris?", tools=TOOLS, tool_choice=ToolChoice("required"), think=True)
    turn = rt.prepare(req)
    assert turn.think and turn.mask is not None
    for tok in session.model.tokenize(ANALYSIS + write_calls(OSS, [CALL]), add_special=False, parse_special=False):
        turn.mask.advance(tok)  # raises where the grammar refuses a token
    assert turn.mask.done() or turn.mask.matcher.is_accepting()


# A format whose markers are a control token of the tiny models' vocabulary (SmolLM2's <|im_start|>).
CONTROL = ToolFormat("control", "test", (), "<|im_start|>call {name} ", " done", parallel=False)


def test_markers_that_are_control_tokens_are_written_into_the_text(session) -> None:
    rt = session.runtime
    rt.chat.tool_format = CONTROL  # the tiny model's own (SmolLM2) template, this format's calls
    flag = Tool("set_flag", "", {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]})
    req = GenerateRequest(prompt="Flag?", tools=(flag,), tool_choice=ToolChoice("required"), n_predict=40)
    result = session.generate(req)
    assert result.stop == "eog" and result.text.startswith("<|im_start|>call set_flag ")
    got = parse_tool_calls(CONTROL, result.text, (flag,))
    assert [c.name for c in got.calls] == ["set_flag"] and json.loads(got.calls[0].arguments).keys() == {"on"}


def test_gemma_4_reasons_in_its_thought_channel_before_a_call() -> None:
    """Gemma 4's template has ``enable_thinking`` but no ``<think>``: a turn with calls reasons in
    its own ``<|channel>thought`` block, as the template writes it before a history's call."""
    gemma = BY_NAME["gemma-4"]
    name, args, cid = CALL
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "reasoning_content": THOUGHT,
            "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}],
        },
        {"role": "tool", "tool_call_id": cid, "content": "sunny"},
    ]
    text = (
        _environment()
        .from_string(template("google-gemma-4-31B-it"))
        .render(messages=messages, tools=[t.openai() for t in TOOLS], add_generation_prompt=True)
    )
    block = gemma.reasoning[0] + THOUGHT + "\n" + gemma.reasoning[1]
    assert block + write_calls(gemma, [CALL]) in text
    g = tool_constraint(gemma, TOOLS, ToolChoice("required"), think="open")
    assert g is not None and accepts(g.grammar, block + write_calls(gemma, [CALL]))
    assert not accepts(g.grammar, "<think>x</think>" + write_calls(gemma, [CALL]))
    r = renderer(template("google-gemma-4-31B-it"))
    req = GenerateRequest(prompt="Weather?", tools=TOOLS, tool_choice=ToolChoice("required"))
    assert r.think_ctl == "template" and reasoning_markers(r, req) == gemma.reasoning
    assert reasoning_markers(r, GenerateRequest(prompt="Weather?")) == gemma.reasoning  # no calls: the same


# Formats whose every answer starts inside their reasoning block (ToolFormat.reasoning_first):
# the template's history writes a call turn as <open>REASONING<close> then the calls, or, without
# reasoning, the close alone (MiniMax M3) or an empty block (Kimi K3, whose prompt opens it).
FIRST = {"MiniMax-M3": "", "Kimi-K3": "<|open|>think<|sep|>"}


@pytest.mark.parametrize("name", sorted(FIRST))
def test_an_answer_that_starts_inside_the_block_closes_it_before_the_calls(name: str) -> None:
    r = renderer(template(name))
    fmt = r.tool_format
    assert fmt.reasoning_first
    opening, closing = fmt.reasoning
    call = write_calls(fmt, [CALL])
    for thought in (THOUGHT, ""):
        made = {"id": CALL[2], "type": "function", "function": {"name": CALL[0], "arguments": CALL[1]}}
        messages = [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": thought, "tool_calls": [made]},
            {"role": "tool", "tool_call_id": CALL[2], "name": CALL[0], "content": "sunny"},
        ]
        text = _environment().from_string(r.source).render(messages=messages, tools=[t.openai() for t in TOOLS])
        block = (opening + thought if thought else FIRST[name]) + closing
        assert block + call in text
    inside = tool_constraint(fmt, TOOLS, ToolChoice("required"), think="inside")
    closed = tool_constraint(fmt, TOOLS, ToolChoice("required"), think="closed")
    assert inside is not None and closed is not None
    assert accepts(inside.grammar, THOUGHT + closing + call)
    assert accepts(inside.grammar, opening + THOUGHT + closing + call)
    assert accepts(closed.grammar, closing + call) and not accepts(closed.grammar, call)
    assert not accepts(closed.grammar, THOUGHT + closing + call)


@pytest.mark.parametrize("think", [True, False])
def test_the_output_of_such_a_turn_splits_at_the_close(think: bool) -> None:
    r = renderer(template("MiniMax-M3"))
    req = GenerateRequest(prompt="Weather?", tools=TOOLS, tool_choice=ToolChoice("required"))
    opens = r.render_turn([Message("user", "Weather?")], think=think, tools=TOOLS).opens_reasoning
    split, inside, marks = reasoning_split(r, req, think, opens)
    # think off: the template's thinking_mode "disabled" closed the block in the prompt
    assert split and inside == think and marks == ("<mm:think>", "</mm:think>")
    out = ("<mm:think>" + THOUGHT + "</mm:think>" if think else "") + write_calls(r.tool_format, [CALL])
    d = Detokenizer(split_think=split, in_reasoning=inside, markers=marks)
    for k in range(0, len(out), 3):
        d.push(out[k : k + 3].encode())
    d.finish()
    assert d.reasoning == (THOUGHT if think else "") and d.text == write_calls(r.tool_format, [CALL])
    assert reasoning_split(r, GenerateRequest(prompt="Hi"), think, opens) == (True, think, marks)  # no calls: same


def test_a_gpt_oss_text_answer_opens_its_final_channel_which_is_not_content() -> None:
    messages = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "It is sunny."}]
    messages.append({"role": "user", "content": "Thanks."})
    text = (
        _environment()
        .from_string(template("openai-gpt-oss-120b"))
        .render(messages=messages, tools=[t.openai() for t in TOOLS], add_generation_prompt=True)
    )
    answer = OSS.text_open + "It is sunny."
    assert "<|start|>assistant" + answer + "<|end|>" in text  # what the model writes after "<|start|>assistant"
    auto = tool_constraint(OSS, TOOLS, ToolChoice("auto"), think="open")
    required = tool_constraint(OSS, TOOLS, ToolChoice("required"))
    assert auto is not None and required is not None
    assert accepts(auto.grammar, answer) and accepts(auto.grammar, ANALYSIS + answer)
    assert not accepts(required.grammar, answer)
    assert parse_tool_calls(OSS, answer, TOOLS).content == "It is sunny."
    stream = ToolStream(OSS, TOOLS)
    deltas = [d for k in range(0, len(answer), 2) for d in stream.feed(answer[k : k + 2])] + stream.finish()
    assert "".join(d[1] for d in deltas) == "It is sunny."
