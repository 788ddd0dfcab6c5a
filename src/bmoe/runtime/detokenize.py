"""Incremental detokenization: token pieces in, (text, reasoning) deltas out.

Pieces are bytes; a UTF-8 character can span tokens, so an incremental decoder holds the
incomplete tail. Text inside <think>...</think> (or a format's own markers: runtime/reasoning.py)
is reasoning; an answer that starts inside the block (the prompt opened it) may open it again,
which is dropped; the markup that opens the answer's text (``answer_open``: harmony's final
channel), at the start of the output or right after the block, is dropped too. A marker can also
span tokens, so a possible partial marker at the end is held back until it resolves.
"""

from __future__ import annotations

import codecs

from bmoe.runtime.reasoning import CLOSE, OPEN


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class Detokenizer:
    def __init__(
        self,
        *,
        split_think: bool,
        in_reasoning: bool = False,
        markers: tuple[str, str] = (OPEN, CLOSE),
        answer_open: str = "",
    ) -> None:
        """``markers``: what opens and closes reasoning (a format's own: gpt-oss's analysis channel);
        ``answer_open``: what opens the answer's text where it starts (gpt-oss's final channel)."""
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._split = split_think
        self._in_reasoning = in_reasoning and split_think
        self._pending = ""
        self._markers = markers
        self._lead = self._in_reasoning  # nothing read yet of a block the answer starts inside
        self._answer_open = answer_open if split_think else ""
        self._at_answer = not self._in_reasoning  # where the answer's text may start with its opening
        self.text = ""
        self.reasoning = ""

    def push(self, piece: bytes) -> tuple[str, str]:
        self._pending += self._utf8.decode(piece)
        return self._drain(final=False)

    def finish(self) -> tuple[str, str]:
        self._pending += self._utf8.decode(b"", final=True)
        return self._drain(final=True)

    def _drop(self, opening: str, final: bool) -> bool:
        """Drop ``opening`` where the pending text starts with it; False: it may yet (wait for more)."""
        if opening.startswith(self._pending) and not final and self._pending != opening:
            return False
        if self._pending.startswith(opening):
            self._pending = self._pending[len(opening) :]
        return True

    def _drain(self, *, final: bool) -> tuple[str, str]:
        d_text, d_reason = "", ""
        while self._pending:
            if self._lead:  # a block the answer starts inside may still be opened: the opening is markup
                if not self._drop(self._markers[0], final):
                    break
                self._lead = False
                continue
            if self._at_answer and not self._in_reasoning and self._answer_open:
                if not self._drop(self._answer_open, final):  # the answer's opening markup: not text
                    break
                self._at_answer = False
                continue
            if not self._split:
                d_text, self._pending = d_text + self._pending, ""
                break
            marker = self._markers[1] if self._in_reasoning else self._markers[0]
            at = self._pending.find(marker)
            if at >= 0:
                head, self._pending = self._pending[:at], self._pending[at + len(marker) :]
                if self._in_reasoning:
                    d_reason += head
                else:
                    d_text += head
                self._in_reasoning = not self._in_reasoning
                self._at_answer = not self._in_reasoning
                continue
            keep = 0 if final else _partial_suffix(self._pending, marker)
            head = self._pending[: len(self._pending) - keep]
            self._pending = self._pending[len(head) :]
            if self._in_reasoning:
                d_reason += head
            else:
                d_text += head
            break
        self.text += d_text
        self.reasoning += d_reason
        return d_text, d_reason
