"""Reasoning in plain chat (no tools), as each template marks it (#36 follow-up): Qwen3's and
R1's ``<think>``, gpt-oss's analysis channel (harmony), Gemma 4's thought channel, read from the
REAL templates (runtime/reasoning.py). The block is reasoning, the rest the content, and no
markup of either is left in the content; the history turn is rendered as the template wants.
Tiny-model runs take the runtime's own path (the steps, GenerateResult.reasoning, the history)
with the model's tokens scripted."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

import bmoe.runtime.runtime as runtime_mod
from bmoe.cli.loop import run_session
from bmoe.config import SessionConfig
from bmoe.runtime.chat import ChatRenderer, Message
from bmoe.runtime.detokenize import Detokenizer
from bmoe.runtime.reasoning import GEMMA4, HARMONY, HY3, MINIMAX_M3, THINK, ReasoningFormat, reasoning_format
from bmoe.runtime.tool_turn import answer_open, reasoning_split
from bmoe.session import GenerateRequest, Session

TEMPLATES = Path(
    os.environ.get("BMOE_LLAMA_TEMPLATES") or Path(sys.prefix) / "share" / "llama.cpp" / "models" / "templates"
)
OSS, GEMMA = "openai-gpt-oss-120b", "google-gemma-4-31B-it"
THOUGHT, ANSWER = "The user greets; greet back.", "Hello! How can I help?"
HARMONY_OUT = f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>{ANSWER}"
GEMMA_OUT = f"<|channel>thought\n{THOUGHT}\n<channel|>{ANSWER}"


def template(name: str) -> str:
    path = TEMPLATES / f"{name}.jinja"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: run scripts/setup.sh --test, or set BMOE_LLAMA_TEMPLATES")
    return path.read_text()


def renderer(name: str) -> ChatRenderer:
    return ChatRenderer("template", template(name), "<s>", "</s>")


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        (OSS, HARMONY),
        (GEMMA, GEMMA4),
        ("google-gemma-4-31B-it-interleaved", GEMMA4),
        ("MiniMax-M3", MINIMAX_M3),
        ("MiniMax-M2", THINK),
        ("Qwen-Qwen3-0.6B", THINK),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", THINK),
        ("meta-llama-Llama-3.1-8B-Instruct", None),
    ],
)
def test_each_template_says_how_its_model_marks_reasoning(name: str, fmt: ReasoningFormat | None) -> None:
    assert reasoning_format(template(name)) is fmt
    assert renderer(name).reasoning is fmt


def split(out: str, step: int, **kw) -> tuple[str, str]:
    d = Detokenizer(split_think=True, **kw)
    for k in range(0, len(out), step):
        d.push(out[k : k + step].encode())
    d.finish()
    return d.text, d.reasoning


@pytest.mark.parametrize("step", [1, 3, 100])
def test_harmony_analysis_is_reasoning_and_the_final_channel_the_content(step: int) -> None:
    kw = {"markers": HARMONY.markers, "answer_open": HARMONY.answer_open}
    assert split(HARMONY_OUT, step, **kw) == (ANSWER, THOUGHT)
    # an answer without analysis opens its final channel at once: the opening is not content
    assert split(f"<|channel|>final<|message|>{ANSWER}", step, **kw) == (ANSWER, "")
    # text that only starts like the opening is content; so is a cut-off opening at the end
    assert split("<|channel|>fin", step, **kw) == ("<|channel|>fin", "")
    assert split(f"<|chan {ANSWER}", step, **kw) == (f"<|chan {ANSWER}", "")


@pytest.mark.parametrize("step", [1, 4])
def test_gemma_4s_thought_channel_is_reasoning(step: int) -> None:
    assert split(GEMMA_OUT, step, markers=GEMMA4.markers) == (ANSWER, THOUGHT + "\n")


def test_a_plain_gpt_oss_turn_splits_its_analysis_whatever_think_says() -> None:
    r = renderer(OSS)
    plain = GenerateRequest(prompt="Hi")
    for think in (True, False):
        assert reasoning_split(r, plain, think, False) == (True, False, HARMONY.markers)
    assert answer_open(r, True) == "<|channel|>final<|message|>"
    g = renderer(GEMMA)
    assert reasoning_split(g, plain, True, False) == (True, False, GEMMA4.markers)
    assert reasoning_split(g, plain, False, False)[0] is False  # think off: the prompt closed the block
    assert answer_open(g, True) == ""


@pytest.mark.parametrize("out", [f"<mm:think>{THOUGHT}</mm:think>{ANSWER}", f"{THOUGHT}</mm:think>{ANSWER}"])
def test_a_plain_minimax_m3_answer_starts_inside_its_block(out: str) -> None:
    """M3's template reads all before ``</mm:think>`` as reasoning (its opening optional), and
    sends an answer back as ``</mm:think>`` and the content where it has no reasoning."""
    r = renderer("MiniMax-M3")
    plain = GenerateRequest(prompt="Hi")
    opened = r.render_turn([Message("user", "Hi")], think=True).opens_reasoning  # thinking_mode "enabled"
    assert opened and reasoning_split(r, plain, True, opened) == (True, True, MINIMAX_M3.markers)
    # thinking_mode "disabled": the prompt closed the block, the answer is content from its start
    closed = r.render_turn([Message("user", "Hi")], think=False).opens_reasoning
    assert not closed and reasoning_split(r, plain, False, closed) == (True, False, MINIMAX_M3.markers)
    # the template's own default ("adaptive", the client's chat_template_kwargs): it starts inside
    adaptive = r.render_turn([Message("user", "Hi")], think=True, template_vars={"thinking_mode": "adaptive"})
    assert adaptive.opens_reasoning and not adaptive.text.endswith("<mm:think>")
    assert split(out, 3, in_reasoning=True, markers=MINIMAX_M3.markers) == (ANSWER, THOUGHT)
    assert split(f"</mm:think>{ANSWER}", 3, in_reasoning=True, markers=MINIMAX_M3.markers) == (ANSWER, "")
    text = r.render([Message("user", "Hi"), Message("assistant", ANSWER), Message("user", "Again")], think=True)
    assert f"</mm:think>{ANSWER}" in text


def test_gpt_oss_history_sends_back_the_final_channel_only() -> None:
    turns = [Message("user", "Hi"), Message("assistant", ANSWER), Message("user", "Again")]
    text = renderer(OSS).render(turns, think=True)
    assert "<|start|>user<|message|>Hi<|end|>" in text
    assert text.endswith(
        f"<|start|>assistant<|channel|>final<|message|>{ANSWER}<|end|>"
        "<|start|>user<|message|>Again<|end|><|start|>assistant"
    )
    assert text.plain == ("Hi", ANSWER, "Again")


def test_gemma_4_opens_no_block_and_closes_it_empty_with_think_off() -> None:
    r = renderer(GEMMA)
    on = r.render_turn([Message("user", "Hi")], think=True)
    off = r.render_turn([Message("user", "Hi")], think=False)
    assert on.text.endswith("<|turn>user\nHi<turn|>\n<|turn>model\n") and not on.opens_reasoning
    assert off.text.endswith("<|turn>model\n<|channel>thought\n<channel|>") and not off.opens_reasoning
    history = r.render([Message("user", "Hi"), Message("assistant", ANSWER), Message("user", "Again")], think=True)
    assert f"<|turn>model\n{ANSWER}<turn|>\n<|turn>user\nAgain<turn|>\n" in history


class Scripted:
    """A sampler that takes the given tokens in order (the model's output, scripted)."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = list(tokens)

    def sample(self, logits) -> int:  # noqa: ANN001
        return self.tokens.pop(0)

    def taken(self, tok: int) -> None:
        pass


@pytest.fixture()
def session(tiny_models):
    s = Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=1024, n_threads=1))
    yield s
    s.close()


def scripted_turn(session, monkeypatch, out: str, *, parse_special: bool = False, **req):  # noqa: ANN001, ANN201
    tokens = session.model.tokenize(out, add_special=False, parse_special=parse_special)
    monkeypatch.setattr(runtime_mod, "Sampler", lambda *a: Scripted(tokens))
    steps = []
    result = session.generate(GenerateRequest(n_predict=len(tokens), **req), on_step=steps.append)
    assert "".join(s.delta_text for s in steps) == result.text
    assert "".join(s.delta_reasoning for s in steps) == result.reasoning
    return result


@pytest.mark.parametrize("think", [True, False])
def test_a_tiny_model_under_gpt_oss_answers_in_the_final_channel(session, monkeypatch, think: bool) -> None:
    rt = session.runtime
    rt.chat = ChatRenderer("template", template(OSS), "", "")
    result = scripted_turn(session, monkeypatch, HARMONY_OUT, prompt="Hi", think=think)
    assert (result.text, result.reasoning) == (ANSWER, THOUGHT)
    assert rt.history[-1] == Message("assistant", ANSWER)
    turn = rt.prepare(GenerateRequest(prompt="Again", clear_kv=False))
    assert turn.rendered.endswith(
        f"<|start|>assistant<|channel|>final<|message|>{ANSWER}<|end|>"
        "<|start|>user<|message|>Again<|end|><|start|>assistant"
    )


def test_a_tiny_model_under_gemma_4_reasons_in_its_thought_channel(session, monkeypatch) -> None:
    session.runtime.chat = ChatRenderer("template", template(GEMMA), "", "")
    result = scripted_turn(session, monkeypatch, GEMMA_OUT, prompt="Hi", think=True)
    assert (result.text, result.reasoning) == (ANSWER, THOUGHT + "\n")


def test_control_tokens_of_the_reasoning_markup_are_read_not_dropped(session, monkeypatch) -> None:
    """Markers that are control tokens of the vocabulary (gpt-oss's <|channel|>, Gemma 4's
    <|channel>; here the tiny vocabulary's <|im_start|>) are written into the text the split
    reads: llama.cpp leaves a control token out of a token's text, which would leave the
    reasoning in the content."""
    chat = ChatRenderer("template", template(OSS), "", "")
    chat.reasoning = ReasoningFormat("test", "", "<|im_start|>think\n", "<|im_start|>answer\n", always=True)
    session.runtime.chat = chat
    out = f"<|im_start|>think\n{THOUGHT}<|im_start|>answer\n{ANSWER}"
    assert len(session.model.tokenize("<|im_start|>", add_special=False, parse_special=True)) == 1
    result = scripted_turn(session, monkeypatch, out, parse_special=True, prompt="Hi")
    assert (result.text, result.reasoning) == (ANSWER, THOUGHT)


def test_a_tiny_model_under_minimax_m3_answers_after_its_block(session, monkeypatch) -> None:
    session.runtime.chat = ChatRenderer("template", template("MiniMax-M3"), "", "")
    result = scripted_turn(session, monkeypatch, f"{THOUGHT}</mm:think>{ANSWER}", prompt="Hi", think=True)
    assert (result.text, result.reasoning) == (ANSWER, THOUGHT)
    result = scripted_turn(session, monkeypatch, ANSWER, prompt="Hi", think=False)  # thinking_mode "disabled"
    assert (result.text, result.reasoning) == (ANSWER, "")


def test_a_tiny_model_under_hy3_reasons_in_its_own_block(session, monkeypatch) -> None:
    """Hy3's switch (reasoning_effort "high" / "no_think") opens or closes its suffixed block in the
    prompt; the output splits at ``</think:opensource>``."""
    session.runtime.chat = ChatRenderer("template", template("tencent-Hy3"), "", "")
    assert session.runtime.chat.reasoning is HY3
    result = scripted_turn(session, monkeypatch, f"{THOUGHT}</think:opensource>{ANSWER}", prompt="Hi", think=True)
    assert (result.text, result.reasoning) == (ANSWER, THOUGHT)
    result = scripted_turn(session, monkeypatch, ANSWER, prompt="Hi", think=False)
    assert (result.text, result.reasoning) == (ANSWER, "")


# (template, its reasoning row, the output of a turn that reasons: the prompt opened the block or not)
OWN_BLOCKS = [
    ("Kimi-K3", "kimi-k3", f"{THOUGHT}<|close|>think<|sep|><|open|>response<|sep|>{ANSWER}"),
    ("ByteDance-Seed-OSS", "seed-oss", f"<seed:think>{THOUGHT}</seed:think>{ANSWER}"),
    ("upstage-Solar-Open-100B", "solar-open", f"<|think|>{THOUGHT}<|end|><|begin|>assistant<|content|>{ANSWER}"),
    ("Cohere2MoE", "cohere-north", f"{THOUGHT}<|END_THINKING|><|START_TEXT|>{ANSWER}"),
    (
        "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
        "command-r7b",
        f"<|START_THINKING|>{THOUGHT}<|END_THINKING|><|START_RESPONSE|>{ANSWER}",
    ),
]


@pytest.mark.parametrize(("name", "row", "out"), OWN_BLOCKS, ids=[b[0] for b in OWN_BLOCKS])
def test_a_tiny_model_under_a_templates_own_block_splits_there(session, monkeypatch, name, row, out) -> None:
    """Kimi K3's, Seed-OSS's, Solar Open's and Cohere's blocks are read as reasoning (their switch
    set from think: runtime/think_switch.py); with think off the prompt closed it, and the output
    is content."""
    session.runtime.chat = ChatRenderer("template", template(name), "", "")
    assert session.runtime.chat.reasoning is not None and session.runtime.chat.reasoning.name == row
    result = scripted_turn(session, monkeypatch, out, prompt="Hi", think=True)
    assert (result.text, result.reasoning) == (ANSWER, THOUGHT)
    result = scripted_turn(session, monkeypatch, ANSWER, prompt="Hi", think=False)
    assert (result.text, result.reasoning) == (ANSWER, "")


def test_the_line_protocol_reports_the_same_split(session, monkeypatch) -> None:
    session.runtime.chat = ChatRenderer("template", template(OSS), "", "")
    tokens = session.model.tokenize(HARMONY_OUT, add_special=False, parse_special=False)
    monkeypatch.setattr(runtime_mod, "Sampler", lambda *a: Scripted(tokens))
    out = io.StringIO()
    assert (
        run_session(
            session,
            io.StringIO(json.dumps({"cmd": "generate", "id": 1, "prompt": "Hi", "n_predict": len(tokens)}) + "\n"),
            out,
        )
        == 0
    )
    lines = out.getvalue().splitlines()
    done = json.loads(next(line for line in lines if line.startswith("BMOE_DONE ")).split(" ", 1)[1])
    assert (done["text"], done["reasoning"]) == (ANSWER, THOUGHT)
    steps = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("BMOE_PROGRESS ")]
    assert "".join(s["delta_text"] for s in steps) == ANSWER
    assert "".join(s["delta_reasoning"] for s in steps) == THOUGHT


@pytest.mark.parametrize("name", [OSS, GEMMA, "google-gemma-4-31B-it-interleaved", "MiniMax-M3"])
def test_a_tool_formats_own_block_is_the_templates_reasoning_block(name: str) -> None:
    """The tool path's block (ToolFormat.reasoning, bmoe.constrain) and plain chat's (this table)
    are the same markers, so a turn reads the same whether it may call tools or not."""
    r = renderer(name)
    assert r.reasoning is not None and r.tool_format.reasoning == r.reasoning.markers
    assert r.tool_format.reasoning_first == r.reasoning.first
    assert r.tool_format.text_open == r.reasoning.answer_open
