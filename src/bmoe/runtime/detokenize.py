"""Incremental detokenization: token pieces in, (text, reasoning) deltas out.

Pieces are bytes; a UTF-8 character can span tokens, so an incremental decoder holds the
incomplete tail. Text inside <think>...</think> (or a format's own markers) is reasoning; an
answer that starts inside the block (the prompt opened it) may open it again, which is dropped;
a marker can also span tokens, so a possible partial marker at the end is held back until it
resolves.
"""

from __future__ import annotations

import codecs

OPEN, CLOSE = "<think>", "</think>"


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class Detokenizer:
    def __init__(
        self, *, split_think: bool, in_reasoning: bool = False, markers: tuple[str, str] = (OPEN, CLOSE)
    ) -> None:
        """``markers``: what opens and closes reasoning (a format's own: gpt-oss's analysis channel)."""
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._split = split_think
        self._in_reasoning = in_reasoning and split_think
        self._pending = ""
        self._markers = markers
        self._lead = self._in_reasoning  # nothing read yet of a block the answer starts inside
        self.text = ""
        self.reasoning = ""

    def push(self, piece: bytes) -> tuple[str, str]:
        self._pending += self._utf8.decode(piece)
        return self._drain(final=False)

    def finish(self) -> tuple[str, str]:
        self._pending += self._utf8.decode(b"", final=True)
        return self._drain(final=True)

    def _drain(self, *, final: bool) -> tuple[str, str]:
        d_text, d_reason = "", ""
        while self._pending:
            if self._lead:  # a block the answer starts inside may still be opened: the opening is markup
                opening = self._markers[0]
                if opening.startswith(self._pending) and not final and self._pending != opening:
                    break
                if self._pending.startswith(opening):
                    self._pending = self._pending[len(opening) :]
                self._lead = False
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
