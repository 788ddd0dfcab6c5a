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
        out, self._held = self._release(self._held + delta, final=False)
        self.text += out
        return out

    def finish(self) -> str:
        """The generation ended: release what was held back, up to a stop it holds."""
        out, self._held = ("", "") if self.hit else self._release(self._held, final=True)
        self.text += out
        return out

    def _release(self, buf: str, final: bool) -> tuple[str, str]:
        """What of ``buf`` to release and what to hold, setting ``hit`` at a decided match.

        A full match is decided only once no other stop string that starts before it can still
        complete (``<b<`` beside ``b``: ``<b`` holds ``b`` but may be the start of ``<b<``); until
        then the text from that earlier start is held. At the end nothing can grow any more."""
        found = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        first = min(found) if found else len(buf)
        if not final:
            open_from = len(buf) - self._open_tail(buf)
            if open_from < first:
                return buf[:open_from], buf[open_from:]
        if found:
            self.hit = True
            return buf[:first], ""
        return buf, ""

    def _open_tail(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of some stop string.

        Holding back exactly that much is enough: a stop starting any earlier would make a longer
        such suffix."""
        for n in range(min(len(buf), max(len(s) for s in self.stops) - 1), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0
