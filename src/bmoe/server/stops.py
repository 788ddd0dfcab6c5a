"""Stop strings over streamed text.

The session has no stop strings, so the server watches the answer as it streams: it holds back
only the tail that could still grow into a stop string, and at the first full match it keeps
the text before it and tells the caller to cancel the generation.
"""
from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.text = ""  # everything released so far
        self.hit = False
        self._held = ""

    def push(self, delta: str) -> str:
        """Feed new text; return the part that can be released now (never part of a stop)."""
        if self.hit:
            return ""
        if not self.stops:
            self.text += delta
            return delta
        buf = self._held + delta
        found = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if found:
            out, self._held, self.hit = buf[: min(found)], "", True
        else:
            keep = self._open_tail(buf)
            out, self._held = buf[: len(buf) - keep], buf[len(buf) - keep :]
        self.text += out
        return out

    def finish(self) -> str:
        """The generation ended without a match: release what was held back."""
        out, self._held = ("" if self.hit else self._held), ""
        self.text += out
        return out

    def _open_tail(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of some stop string.

        Holding back exactly that much is enough: a stop starting any earlier would make a longer
        such suffix."""
        for n in range(min(len(buf), max(len(s) for s in self.stops) - 1), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0
