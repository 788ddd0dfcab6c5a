"""Where a model writes its reasoning, read from its chat template: one row per way of marking it.

Qwen3, DeepSeek R1 and most reasoning templates wrap it in ``<think>`` ... ``</think>``; gpt-oss
(harmony) writes it in its analysis channel and its answer in its final channel; Gemma 4 in its
thought channel; MiniMax M3 in ``<mm:think>``, every answer starting inside it. The output's
text between a row's ``open`` and ``close`` is reasoning (``reasoning_content``), the rest the
answer's content (runtime/detokenize.py splits it), and the markup that opens the answer
(``answer_open``: harmony's final channel) is neither.

How a think:false request is honoured (``think_control``) is read from the template too: by
the template's own switch (runtime/think_switch.py), or by closing an empty ``<think>`` block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bmoe.runtime.think_switch import think_switch

ThinkCtl = Literal["template", "prefill", "none"]
OPEN, CLOSE = "<think>", "</think>"
# What a template-less "think off" looks like for models that open a <think> block.
EMPTY_THINK = OPEN + "\n\n" + CLOSE + "\n\n"


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    name: str
    detect: str  # a text of the template that says it writes reasoning this way
    open: str  # what opens the block in the model's output
    close: str  # what closes it
    answer_open: str = ""  # markup that opens the answer, after the block or in its place: not content
    # The model reasons whatever ``think`` says (the template has no switch bmoe sets): its block
    # is split off in every turn.
    always: bool = False
    # Every answer starts inside the block, its opening optional, and closes it before the
    # answer's text (MiniMax M3's template reads all before ``</mm:think>`` as reasoning).
    first: bool = False

    @property
    def markers(self) -> tuple[str, str]:
        return self.open, self.close


THINK = ReasoningFormat("think", OPEN, OPEN, CLOSE)
HARMONY = ReasoningFormat(
    "harmony",
    "<|channel|>analysis<|message|>",
    "<|channel|>analysis<|message|>",
    "<|end|><|start|>assistant",
    answer_open="<|channel|>final<|message|>",
    always=True,
)
GEMMA4 = ReasoningFormat("gemma-4", "<|channel>thought", "<|channel>thought\n", "<channel|>")
MINIMAX_M3 = ReasoningFormat("minimax-m3", "<mm:think>", "<mm:think>", "</mm:think>", always=True, first=True)
# Hy3 writes its tokens with a suffix (its template's HYTK): <think:opensource> ... </think:opensource>.
HY3 = ReasoningFormat("hy3", "'<think{}>'.format(HYTK)", "<think:opensource>", "</think:opensource>")
SEED_OSS = ReasoningFormat("seed-oss", "'<seed:think>'", "<seed:think>", "</seed:think>")
# Kimi K3 (its tags written by a macro): the answer is its response channel, opened as the block closes.
KIMI_K3 = ReasoningFormat(
    "kimi-k3",
    "open_tag('think' if thinking else 'response')",
    "<|open|>think<|sep|>",
    "<|close|>think<|sep|><|open|>response<|sep|>",
)
# Solar Open reasons in an assistant message of its own; the answer's opens with <|content|>.
SOLAR_OPEN = ReasoningFormat(
    "solar-open", "<|begin|>assistant<|think|>", "<|think|>", "<|end|><|begin|>assistant", answer_open="<|content|>"
)
# Cohere's: <|START_THINKING|> ... <|END_THINKING|>, the answer in <|START_TEXT|> (North, Cohere2MoE)
# or <|START_RESPONSE|> (Command R7B).
COHERE_NORTH = ReasoningFormat(
    "cohere-north",
    "{% if reasoning %}<|START_THINKING|>",
    "<|START_THINKING|>",
    "<|END_THINKING|>",
    answer_open="<|START_TEXT|>",
)
COMMAND_R7B = ReasoningFormat(
    "command-r7b",
    "{%- if not enable_thinking -%}<|START_THINKING|><|END_THINKING|>",
    "<|START_THINKING|>",
    "<|END_THINKING|>",
    answer_open="<|START_RESPONSE|>",
)
# The first row whose ``detect`` text the template holds is its format (harmony's and Gemma 4's
# templates never write ``<think>``; a template that takes ``enable_thinking`` without writing
# any block of its own is assumed to use ``<think>``).
FORMATS: tuple[ReasoningFormat, ...] = (
    HARMONY,
    GEMMA4,
    MINIMAX_M3,
    HY3,
    SEED_OSS,
    KIMI_K3,
    SOLAR_OPEN,
    COHERE_NORTH,
    COMMAND_R7B,
    THINK,
)


def reasoning_format(template: str | None) -> ReasoningFormat | None:
    """How the template's model marks its reasoning (None: it does not reason, or not visibly)."""
    if not template:
        return None
    for fmt in FORMATS:
        if fmt.detect in template:
            return fmt
    return THINK if "enable_thinking" in template else None


def think_control(template: str | None) -> ThinkCtl:
    """How a think:false request can be honoured, read from the template itself."""
    if not template:
        return "none"
    if think_switch(template).can_off:
        return "template"
    if OPEN in template:
        return "prefill"
    return "none"


def opens(prompt: str, fmt: ReasoningFormat | None) -> bool:
    """Whether a generation prompt leaves ``fmt``'s block open (the output starts as reasoning).
    A ``first`` format's answer starts inside its block unless the prompt closed it (MiniMax M3's
    ``thinking_mode`` "disabled" ends the prompt with ``</mm:think>``)."""
    if fmt is not None and fmt.first:
        return not prompt.rstrip().endswith(fmt.close)
    return fmt is not None and prompt.rfind(fmt.open) > prompt.rfind(fmt.close)


def closing(tail: str) -> str:
    """What closes an empty block after an opening ``<think>`` followed by ``tail``: the rest of
    EMPTY_THINK where ``tail`` is its start (``<think>\n`` -> ``\n</think>\n\n``)."""
    rest = EMPTY_THINK[len(OPEN) :]
    return rest[len(tail) :] if rest.startswith(tail) else CLOSE + "\n\n"
