"""A generation turn with tools (docs/server.md "Tools"): the grammar of the model's call syntax,
with the format's markers that are one special token of this vocabulary written as that token.

The tool-call policy (formats, grammar, parser) is bmoe.constrain's; this module only asks the
model's vocabulary which markers are special tokens.
"""

from __future__ import annotations

from bmoe.constrain import (
    THINK_CLOSE,
    THINK_OPEN,
    Constraint,
    ConstraintError,
    Think,
    ToolChoice,
    tool_constraint,
    tool_markers,
)
from bmoe.llama.model import LlamaModel
from bmoe.runtime.chat import ChatRenderer
from bmoe.runtime.reasoning import THINK
from bmoe.runtime.results import GenerateRequest
from bmoe.runtime.tool_position import Block


def _calls(req: GenerateRequest) -> bool:
    """Whether the answer is held to the call syntax (tools, and tool_choice not "none")."""
    return bool(req.tools) and (req.tool_choice is None or req.tool_choice.mode != "none")


def _own_reasoning(chat: ChatRenderer) -> tuple[str, str] | None:
    """The format's own reasoning block (gpt-oss's analysis channel, Gemma 4's thought channel),
    where it has one: in a turn with calls it stands for the template's ``<think>``."""
    fmt = chat.tool_format
    return fmt.reasoning if fmt.reasoning[0] else None


def thinks(chat: ChatRenderer, req: GenerateRequest) -> bool:
    """Whether the turn may reason first: always without calls; with calls where the template
    has a ``<think>`` block (Qwen3, DeepSeek R1) or the format its own (gpt-oss, Gemma 4),
    which the grammar then allows before them. A template whose switch bmoe sets but whose block
    is not ``<think>`` nor the format's own (Hy3, Seed-OSS) has its switch off in a turn with calls."""
    block = chat.think_ctl != "none" and chat.reasoning is THINK
    return not _calls(req) or block or _own_reasoning(chat) is not None


def reasoning_markers(chat: ChatRenderer, req: GenerateRequest) -> tuple[str, str] | None:
    """What opens and closes reasoning in the turn's output text (None: no reasoning to split
    out): in a turn with calls the format's own block where it has one (gpt-oss's
    ``<|channel|>analysis<|message|>`` ... ``<|end|><|start|>assistant``), else the template's
    (``chat.reasoning``: ``<think>``, or harmony's analysis or Gemma 4's thought channel)."""
    own = _own_reasoning(chat) if _calls(req) else None
    return own or (chat.reasoning.markers if chat.reasoning is not None else None)


def _starts_inside(chat: ChatRenderer, req: GenerateRequest, think: bool) -> bool:
    """Whether the answer starts inside the format's block (``ToolFormat.reasoning_first``): not
    in a turn that does not reason where the template's switch closed the block in the prompt
    (MiniMax M3's ``thinking_mode`` "disabled", Kimi K3's ``thinking`` false: runtime/think_switch.py)."""
    if not think and chat.switch.can_off:
        return False
    return _calls(req) and chat.tool_format.reasoning_first and _own_reasoning(chat) is not None


def reasoning_split(
    chat: ChatRenderer, req: GenerateRequest, think: bool, opens: bool
) -> tuple[bool, bool, tuple[str, str]]:
    """How the turn's output splits into reasoning and text: whether it does, whether it starts
    as reasoning (the prompt opened the block, or every answer of the format starts inside it,
    closing it at once where the turn does not reason), and the markers. A template whose model
    reasons whatever ``think`` says (gpt-oss) has its block split off in every turn."""
    marks = reasoning_markers(chat, req)
    fmt = chat.reasoning
    own = _calls(req) and _own_reasoning(chat) is not None  # the format's block, not the template's
    # a template's ``first`` block: ``opens`` says whether the prompt left it open (reasoning.opens)
    first = _starts_inside(chat, req, think) or (not own and fmt is not None and fmt.first and opens)
    always = fmt is not None and fmt.always
    split = marks is not None and (think or first or always)
    return split, split and (opens or first), marks or (THINK_OPEN, THINK_CLOSE)


def answer_open(chat: ChatRenderer, split: bool) -> str:
    """The markup that opens the answer's text in a turn that splits off reasoning (harmony's
    final channel), left out of the text; "" where there is none."""
    return chat.reasoning.answer_open if split and chat.reasoning is not None else ""


def special_markers(model: LlamaModel, chat: ChatRenderer, think: bool = False) -> dict[str, int]:
    """The format's markers (and the reasoning block's, with ``think``) that are one special token
    (their text tokenizes to more tokens)."""
    out: dict[str, int] = {}
    for m in sorted(tool_markers(chat.tool_format) | ({THINK_OPEN, THINK_CLOSE} if think else set())):
        ids = model.tokenize(m, add_special=False, parse_special=True)
        if len(ids) == 1 and len(model.tokenize(m, add_special=False, parse_special=False)) > 1:
            out[m] = ids[0]
    return out


def shown_tokens(
    model: LlamaModel, chat: ChatRenderer, req: GenerateRequest, think: bool, split: bool = False
) -> frozenset[int]:
    """The special tokens a turn writes into its text: in a turn with calls the format's markers
    (its reasoning block's), and where the turn splits off reasoning (``split``) the control
    tokens of the template's reasoning markup (harmony's ``<|channel|>``, Gemma 4's
    ``<|channel>``). A control token is otherwise left out of the text, and the calls (and the
    reasoning) would not read."""
    calls = frozenset(special_markers(model, chat, think).values()) if _calls(req) else frozenset()
    fmt = chat.reasoning
    if not split or fmt is None:
        return calls
    own: set[int] = set()
    for text in (fmt.open, fmt.close, fmt.answer_open):
        for t in model.tokenize(text, add_special=False, parse_special=True) if text else ():
            if model.token_bytes(t) != model.token_bytes(t, special=True):  # a control token
                own.add(t)
    return calls | own


def think_mode(chat: ChatRenderer, req: GenerateRequest, think: bool, opens: bool) -> Think:
    """The reasoning block of a turn with calls, as its grammar holds it (``constrain.Think``):
    where the turn reasons, "inside" when the prompt opened the block or every answer of the
    format starts inside it, else "open"; where it does not, "closed" for such a format."""
    inside = _starts_inside(chat, req, think)
    if think:
        return "inside" if opens or inside else "open"
    return "closed" if inside else ""


def name_block(chat: ChatRenderer, req: GenerateRequest, think: bool, opens: bool) -> Block:
    """The reasoning block a tool turn's answer may start with, for its name decision: the
    grammar's mode and markers (the format's own block, else ``<think>``, whose close may be
    followed by whitespace)."""
    opening, closing = _own_reasoning(chat) or (THINK_OPEN, THINK_CLOSE)
    mode = think_mode(chat, req, think, opens)
    return Block(mode, opening.encode(), closing.encode(), blank=closing == THINK_CLOSE)


def tool_grammar(
    model: LlamaModel, chat: ChatRenderer, req: GenerateRequest, think: bool = False, opens: bool = False
) -> Constraint | None:
    """The constraint of a turn with ``req.tools`` (None: no tools, or tool_choice "none");
    ConstraintError where a json_schema or grammar is given too (an answer keeps one constraint).
    ``think``: the turn reasons first; ``opens``: its prompt opened the block already."""
    choice = req.tool_choice or ToolChoice("auto" if req.tools else "none")
    if not req.tools or choice.mode == "none":
        return None
    if req.json_schema is not None or req.grammar is not None:
        raise ConstraintError(
            "tools",
            "an answer keeps one constraint: give tools or a json_schema/grammar, not both (or tool_choice 'none')",
        )
    special = special_markers(model, chat, think)
    mode = think_mode(chat, req, think, opens)
    return tool_constraint(chat.tool_format, req.tools, choice, req.parallel_tool_calls, special, mode)
