"""The choice of tool as a decision (#36 item 2): what the model would write to pick a tool.

(A format whose call holds a hole before the name, Command R7B's call number or Solar Open's
id, has no decision: ``tool_decision`` returns None and the name comes by constrained generation.)

In every format the tool's name comes at one place after fixed text: the section's opening and
the call's opening up to ``{name}``. What the model writes there is a choice among the tools'
names; the arguments that follow come by constrained generation. Each choice is the name and
the fixed text after it (up to the next hole or the arguments), so that no choice is a prefix of
another (``get`` and ``get_weather`` differ at ``get"`` against ``get_``); where nothing fixed
follows the name (GLM-4.7), the start that all the texts that may follow share (``<``).

- ``required``: the opening is forced, then the name is a choice among the tools;
- a named tool: all of it is forced (one choice);
- ``auto``: nothing is forced; each choice is the whole opening with a name, and the model's
  probability outside them (``p_outside`` of a decision) is its probability of answering in text.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from bmoe.constrain.tool_formats import HOLE, ToolFormat, fill, fixed
from bmoe.constrain.tool_spec import Tool, ToolChoice


@dataclass(frozen=True, slots=True)
class ToolDecision:
    """``forced``: the text the answer starts with, written without a choice; ``choices``: what
    the model writes next for each of ``names`` (in the same order); ``text_outside``: whether the
    answer may instead be text (auto), the probability outside the choices."""

    forced: str
    choices: tuple[str, ...]
    names: tuple[str, ...]
    text_outside: bool


def _name_choice(fmt: ToolFormat, name: str) -> tuple[str, str]:
    """The call's opening before the name, and the name with the fixed text after it."""
    open_ = fmt.call_open
    at = open_.index("{name}")
    after = open_[at + len("{name}") :]
    nxt = HOLE.search(after)
    follow = fill(after[: nxt.start()] if nxt else after)
    if not follow:  # nothing fixed after the name: what every call's next text starts with
        nexts = ["{"] if fmt.args == "json" else [fill(fixed(fmt.param_open)), fill(fmt.call_close)]
        follow = os.path.commonprefix(nexts)
    return fill(open_[:at]), name + follow


def tool_decision(fmt: ToolFormat, tools: Sequence[Tool], choice: ToolChoice) -> ToolDecision | None:
    """The decision of which tool to call (None: ``none``, or no tools)."""
    if choice.mode == "none" or not tools:
        return None
    if HOLE.search(fmt.call_open[: fmt.call_open.index("{name}")]):  # Command R7B's number, Solar's id
        return None  # the model writes a hole before the name: no fixed text to force (docs/server.md)
    chosen = [t for t in tools if choice.mode != "named" or t.name == choice.name]
    before = fill(fmt.section_open) + _name_choice(fmt, chosen[0].name)[0]
    names = tuple(t.name for t in chosen)
    choices = tuple(_name_choice(fmt, n)[1] for n in names)
    if choice.mode == "auto":
        return ToolDecision("", tuple(before + c for c in choices), names, True)
    if choice.mode == "named":
        return ToolDecision(before + choices[0], (), names, False)
    return ToolDecision(before, choices, names, False)
