"""Where a tool turn's name decision looks for its position, in an answer that may reason first
(runtime/tool_choice.py; docs/decide.md "The choice of tool", after a reasoning block).

The choices' text starts where the reasoning block ends: after its close, and after the whitespace
the grammar allows after ``</think>``. Inside the block there is no name position; a token that
writes the block's opening at the answer's start, or whitespace right after its close, leaves
nothing (it is the block's, not a choice's).
"""

from __future__ import annotations

from dataclasses import dataclass

_BLANK = b" \t\r\n"


@dataclass(eq=False)
class Block:
    """Where the choices' text starts in an answer that may reason first. ``mode`` is the
    grammar's (``constrain.Think``): "" none, "open" the answer may open the block, "inside" /
    "closed" it starts inside it. Phases: "maybe" (the text so far may still open the block), "in"
    (inside: no name position), "blank" (after the close, whitespace only so far), "body"."""

    mode: str = ""
    opening: bytes = b""
    closing: bytes = b""
    blank: bool = False  # whitespace may follow the close (``</think>``)
    phase: str = ""
    end: int = 0  # where the close ends (and, inside, where to look for it from)
    base: int = 0  # where the choices' text starts

    def __post_init__(self) -> None:
        self.phase = {"": "body", "open": "maybe"}.get(self.mode, "in")

    def _rest(self, at: bytes) -> bytes:
        """What follows the close and its blank."""
        rest = at[self.end :]
        return rest.lstrip(_BLANK) if self.blank else rest

    def update(self, at: bytes) -> None:
        """The answer's text is ``at`` now."""
        if self.phase == "maybe":
            if not at.startswith(self.opening):
                if not self.opening.startswith(at):
                    self.phase = "body"
                return
            self.phase, self.end = "in", len(self.opening)
        if self.phase == "in":
            i = at.find(self.closing, self.end)
            if i < 0:
                self.end = max(self.end, len(at) - len(self.closing) + 1)
                return
            self.phase, self.end = "blank", i + len(self.closing)
        if self.phase == "blank":
            rest = self._rest(at)
            self.base = len(at) - len(rest)
            self.phase = "body" if rest else "blank"

    def leaves(self, text: bytes, common: bytes) -> bool:
        """Whether the answer's text ``text`` (so far, and one more token) leaves ``common``, the
        text all the choices share, and not for the block (its opening, the blank after it)."""
        if self.phase == "maybe":
            if self.opening.startswith(text) or text.startswith(self.opening):
                return False
            return not common.startswith(text)
        if self.phase == "blank":
            rest = self._rest(text)
            return bool(rest) and not common.startswith(rest)
        return not common.startswith(text[self.base :])
