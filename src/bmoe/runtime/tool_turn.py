"""A generation turn with tools (docs/server.md "Tools"): the grammar of the model's call syntax,
with the format's markers that are one special token of this vocabulary written as that token.

The tool-call policy (formats, grammar, parser) is bmoe.constrain's; this module only asks the
model's vocabulary which markers are special tokens.
"""

from __future__ import annotations

from bmoe.constrain import Constraint, ConstraintError, ToolChoice, tool_constraint, tool_markers
from bmoe.llama.model import LlamaModel
from bmoe.runtime.chat import ChatRenderer
from bmoe.runtime.results import GenerateRequest


def special_markers(model: LlamaModel, chat: ChatRenderer) -> dict[str, int]:
    """The format's markers that are one special token (their text tokenizes to more tokens)."""
    out: dict[str, int] = {}
    for m in sorted(tool_markers(chat.tool_format)):
        ids = model.tokenize(m, add_special=False, parse_special=True)
        if len(ids) == 1 and len(model.tokenize(m, add_special=False, parse_special=False)) > 1:
            out[m] = ids[0]
    return out


def tool_grammar(model: LlamaModel, chat: ChatRenderer, req: GenerateRequest) -> Constraint | None:
    """The constraint of a turn with ``req.tools`` (None: no tools, or tool_choice "none");
    ConstraintError where a json_schema or grammar is given too (an answer keeps one constraint)."""
    choice = req.tool_choice or ToolChoice("auto" if req.tools else "none")
    if not req.tools or choice.mode == "none":
        return None
    if req.json_schema is not None or req.grammar is not None:
        raise ConstraintError(
            "tools",
            "an answer keeps one constraint: give tools or a json_schema/grammar, not both (or tool_choice 'none')",
        )
    special = special_markers(model, chat)
    return tool_constraint(chat.tool_format, req.tools, choice, req.parallel_tool_calls, special)
