"""Each family's reasoning switch, read from its REAL chat template (runtime/think_switch.py):
``think`` on and off render the generation prompt the template writes for that mode, and the
reasoning split follows it (``opens_reasoning``: the output starts inside the block). Effort
values go to the template's own variable (gpt-oss, Hy3, Kimi K3, DeepSeek V4, Solar Open)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bmoe.runtime.chat import ChatRenderer, Message
from bmoe.runtime.reasoning import THINK
from bmoe.runtime.think_switch import GPT_OSS, NO_SWITCH, think_switch

TEMPLATES = Path(
    os.environ.get("BMOE_LLAMA_TEMPLATES") or Path(sys.prefix) / "share" / "llama.cpp" / "models" / "templates"
)
USER = "Hi there"


def renderer(name: str) -> ChatRenderer:
    path = TEMPLATES / f"{name}.jinja"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: run scripts/setup.sh --test, or set BMOE_LLAMA_TEMPLATES")
    return ChatRenderer("template", path.read_text(), "<s>", "</s>")


def tail(r: ChatRenderer, think: bool, **kw: object) -> tuple[str, bool]:
    """The prompt after the user's message, and whether it leaves the reasoning block open."""
    turn = r.render_turn([Message("user", USER)], think=think, **kw)  # type: ignore[arg-type]
    text = str(turn.text)
    return text[text.rfind(USER) + len(USER) :], turn.opens_reasoning


# (template, switch row, think on: the prompt's tail and whether it opens the block, think off: the same)
CASES = [
    (
        "deepseek-ai-DeepSeek-V3.1",
        "deepseek",
        ("<｜Assistant｜><think>", True),
        ("<｜Assistant｜><think></think>", False),
    ),
    (
        "deepseek-ai-DeepSeek-V3.2",
        "deepseek",
        ("<｜Assistant｜><think>", True),
        ("<｜Assistant｜><think></think>", False),
    ),
    ("deepseek-ai-DeepSeek-V4", "deepseek-v4", ("<｜Assistant｜><think>", True), ("<｜Assistant｜></think>", False)),
    (
        "deepseek-ai-DeepSeek-V4-Flash-0731",
        "deepseek-v4-flash",
        ("<｜Assistant｜><think>", True),
        ("<｜Assistant｜></think>", False),
    ),
    ("MiniMax-M3", "minimax-m3", ("[e~[\n]~b]ai\n<mm:think>", True), ("[e~[\n]~b]ai\n</mm:think>", False)),
    (
        "Kimi-K3",
        "kimi-k3",
        ('<|close|>message<|sep|><|end_of_msg|><|open|>message role="assistant"<|sep|><|open|>think<|sep|>', True),
        ('<|close|>message<|sep|><|end_of_msg|><|open|>message role="assistant"<|sep|><|open|>response<|sep|>', False),
    ),
    (
        "ByteDance-Seed-OSS",
        "seed-oss",
        ("<seed:eos><seed:bos>assistant\n", False),
        (
            "<seed:eos><seed:bos>assistant\n<seed:think>\n<seed:cot_budget_reflect>The current thinking budget is 0,"
            " so I will directly start answering the question.</seed:cot_budget_reflect>\n</seed:think>",
            False,
        ),
    ),
    (
        "tencent-Hy3",
        "hy3",
        ("<｜hy_Assistant:opensource｜><think:opensource>", True),
        ("<｜hy_Assistant:opensource｜><think:opensource></think:opensource>", False),
    ),
    (
        "Cohere2MoE",
        "cohere-north",
        ("<|END_TEXT|><|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|>", True),
        (
            "<|END_TEXT|><|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>",
            False,
        ),
    ),
    (
        "upstage-Solar-Open-100B",
        "solar-open",
        ("<|end|><|begin|>assistant", False),
        ("<|end|><|begin|>assistant<|think|><|end|><|begin|>assistant", False),
    ),
    (
        "inclusionai-ling-3.0-flash",
        "enable_thinking",
        ("<|role_end|><role>ASSISTANT</role>\n<think>", True),
        ("<|role_end|><role>ASSISTANT</role>\n<think></think>", False),
    ),
    (
        "HuggingFaceTB-SmolLM3-3B",
        "enable_thinking",
        ("<|im_end|>\n<|im_start|>assistant\n", False),
        ("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n", False),
    ),
    (
        "Qwen-Qwen3-0.6B",
        "enable_thinking",
        ("<|im_end|>\n<|im_start|>assistant\n", False),
        ("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", False),
    ),
    ("GLM-4.6", "enable_thinking", ("<|assistant|>", False), ("/nothink<|assistant|>\n<think></think>", False)),
    (
        "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
        "enable_thinking",
        ("<|im_end|>\n<|im_start|>assistant\n<think>\n", True),
        ("<|im_end|>\n<|im_start|>assistant\n<think></think>", False),
    ),
]


@pytest.mark.parametrize(("name", "row", "on", "off"), CASES, ids=[c[0] for c in CASES])
def test_think_on_and_off_render_the_templates_own_prompt(name: str, row: str, on: tuple, off: tuple) -> None:
    r = renderer(name)
    assert r.switch.name == row and r.think_ctl == "template"
    assert tail(r, True) == on
    assert tail(r, False) == off


def test_granite_3_3_switches_its_system_prompt_not_a_think_block() -> None:
    """Granite 3.3's ``thinking`` adds its reasoning instructions; with it off bmoe appends no
    empty ``<think>`` block of its own (its template is not a prefill one)."""
    r = renderer("ibm-granite-granite-3.3-2B-Instruct")
    on, off = (str(r.render([Message("user", USER)], think=t)) for t in (True, False))
    assert "You can write down your thoughts and reasoning process" in on
    assert "You can write down your thoughts and reasoning process" not in off
    assert on.endswith("<|start_of_role|>assistant<|end_of_role|>")
    assert off.endswith("<|start_of_role|>assistant<|end_of_role|>")


def test_gpt_oss_always_reasons_at_the_effort_given() -> None:
    r = renderer("openai-gpt-oss-120b")
    assert r.switch is GPT_OSS and not r.switch.can_off and r.think_ctl == "none"
    assert "Reasoning: medium" in r.render([Message("user", USER)], think=False)  # the template's default
    for effort in ("low", "medium", "high"):
        assert f"Reasoning: {effort}\n" in r.render([Message("user", USER)], think=True, effort=effort)


def test_effort_goes_to_the_templates_own_variable_while_reasoning_is_on() -> None:
    hy3 = renderer("tencent-Hy3")
    assert "reasoning_effort:low" in hy3.render([Message("user", USER)], think=True, effort="low")
    assert "reasoning_effort:no_think" in hy3.render([Message("user", USER)], think=False, effort="low")
    k3 = renderer("Kimi-K3")
    assert "`thinking_effort=low`" in k3.render([Message("user", USER)], think=True, effort="low")
    assert "`thinking_effort=max`" in k3.render([Message("user", USER)], think=True)  # its default
    v4 = renderer("deepseek-ai-DeepSeek-V4-Flash-0731")
    high = "Reasoning Effort: Absolute maximum with no shortcuts permitted."
    assert high in v4.render([Message("user", USER)], think=True, effort="high")
    assert high not in v4.render([Message("user", USER)], think=True)
    assert high not in v4.render([Message("user", USER)], think=False, effort="high")


def test_a_clients_template_variables_reach_the_template() -> None:
    m3 = renderer("MiniMax-M3")
    assert tail(m3, True, template_vars={"thinking_mode": "adaptive"}) == ("[e~[\n]~b]ai\n", True)
    qwen = renderer("Qwen-Qwen3-0.6B")
    assert tail(qwen, True, template_vars={"enable_thinking": False})[0].endswith("<think>\n\n</think>\n\n")


def test_templates_without_a_switch() -> None:
    assert think_switch(None) is NO_SWITCH
    llama = renderer("meta-llama-Llama-3.1-8B-Instruct")
    assert llama.switch is NO_SWITCH and llama.think_ctl == "none"
    r1 = renderer("deepseek-ai-DeepSeek-R1-Distill-Llama-8B")  # no switch: bmoe closes an empty block
    assert r1.switch is NO_SWITCH and r1.think_ctl == "prefill" and r1.reasoning is THINK


def test_a_turn_with_calls_reasons_only_where_bmoe_reads_the_block() -> None:
    """Hy3's and Seed-OSS's switches are set, but their blocks are not read (no row in
    runtime/reasoning.py): a turn with calls has the switch off, as before the switch was set."""
    from bmoe.constrain import Tool, ToolChoice
    from bmoe.runtime.results import GenerateRequest
    from bmoe.runtime.tool_turn import thinks

    tool = Tool("pick", "", {"type": "object", "properties": {}})
    req = GenerateRequest(prompt=USER, tools=(tool,), tool_choice=ToolChoice("required"))
    for name, reasons in (("tencent-Hy3", False), ("ByteDance-Seed-OSS", False), ("Qwen-Qwen3-0.6B", True)):
        assert thinks(renderer(name), req) is reasons, name


def test_a_variable_the_template_refuses_is_a_request_error() -> None:
    from bmoe.errors import RequestError

    with pytest.raises(RequestError) as e:
        renderer("Kimi-K3").render([Message("user", USER)], think=True, template_vars={"thinking_effort": "medium"})
    assert str(e.value) == (
        "the chat template refused the conversation: Unsupported thinking_effort=medium; "
        "supported values are low, high, and max."
    )
