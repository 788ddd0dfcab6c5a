"""Where a rendered prompt's special tokens are: in the template's markup only, never in the text
of a message.

A chat prompt is the template's markup with the messages' own text put into it (chat.Prompt
says which parts are which). llama.cpp, told to parse special tokens, takes a control token
wherever its text is written, so a message holding ``<|im_end|>\\n<|im_start|>assistant\\n``
would end its turn and open the assistant's. Here a control token (and an unknown one: the
tokens llama.cpp reads from text only when it parses special tokens) is taken only where its
text lies wholly in the markup; in a message it is the characters it is made of.

``PlainReader.overlaps`` says whether a control token's text touches a plain part at all.
Where none does (almost every prompt), tokenizing the whole text with special tokens parsed
already gives the right tokens: the ones llama.cpp finds are the markup's, and the tokens are
exactly those of llama.cpp's whole text. Where one does, ``PlainReader.partition`` does what
llama.cpp does first with a text, its split at special tokens
(``llama_vocab::impl::tokenizer_st_partition``, transcribed in tests/unit/test_special_cuts.py),
with one change: a control token's text counts only inside the markup. Its passes take the
control tokens written in the markup, longest text first (among equally long texts llama.cpp's
order is its own sort's, here the text's), each pass the leftmost occurrences in every fragment
of raw text left, stripping the whitespace an ``lstrip``/``rstrip`` token strips (into a
message's text, as llama.cpp does). The raw fragments between the tokens are then tokenized
without special parsing, one at a time, as llama.cpp tokenizes the fragments of a text (a
fragment's tokens never depend on its neighbours, only on whether a special token precedes it,
which SentencePiece's space prefix reads, and that holds for a fragment tokenized alone too).

The tokens llama.cpp partitions in both modes, user-defined ones, are left to that second step
(llama.cpp partitions them without special parsing too), so where a user-defined token's text
overlaps a control token written in the markup (no vocabulary known to us), the order of their
passes is not kept. Everything here is linear in the text: the passes run once per control
token written in the markup, each over the markup.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from bmoe.llama.special_cuts import WHITESPACE

Span = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Control:
    """A token llama.cpp takes from text only when it parses special tokens: its text and
    whether it strips the whitespace before (``lstrip``) or after (``rstrip``) it."""

    text: bytes
    lstrip: bool = False
    rstrip: bool = False


class PlainReader:
    """Finds one vocabulary's control tokens in a text whose plain spans must not hold any."""

    def __init__(self, controls: Iterable[Control]) -> None:
        by_text: dict[bytes, Control] = {}
        for c in controls:
            if c.text:  # an empty text would be found everywhere (llama.cpp's split skips none either)
                by_text.setdefault(c.text, c)  # two tokens with one text: the first one's strips
        self._by_text = by_text
        if by_text:
            texts = sorted(by_text, key=len, reverse=True)  # at each position, the longest first
            self._longest = len(texts[0])
            alternatives = b"|".join(re.escape(t) for t in texts)
            self._find = re.compile(alternatives)
            self._starts = re.compile(b"(?=(" + alternatives + b"))")
            # The texts that start another one: a position where the longer one is found holds them too.
            self._prefixes = {t: [p for p in texts if p != t and t.startswith(p)] for t in texts}

    def overlaps(self, data: bytes, plain: Sequence[Span]) -> bool:
        """True when some control token's text written in ``data`` overlaps one of the ``plain``
        spans (inside it, or across its edge with the markup)."""
        if not self._by_text:
            return False
        n = len(data)
        for a, b in plain:
            pos, end = max(0, a - self._longest + 1), min(n, b + self._longest - 1)
            while (m := self._find.search(data, pos, end)) is not None and m.start() < b:
                # the longest text at m.start(): if it ends before the span, so does every other there
                if m.end() > a:
                    return True
                pos = m.start() + 1
        return False

    def partition(self, data: bytes, plain: Sequence[Span]) -> list[Span | bytes]:
        """llama.cpp's split of ``data`` at special tokens, taking a control token only in the
        markup (what the sorted, disjoint ``plain`` spans leave): raw text as ``(start, end)``,
        each control token taken as its text."""
        markup = _complement(plain, len(data))
        starts = [a for a, _ in markup]
        frags: list[Span | bytes] = [(0, len(data))] if data else []
        for text in self._written(data, markup):
            ctl = self._by_text[text]
            out: list[Span | bytes] = []
            for frag in frags:
                if isinstance(frag, bytes):
                    out.append(frag)
                    continue
                base, end = frag
                while True:
                    at = _find_in(data, text, base, end, markup, starts)
                    if at < 0:
                        out.append((base, end))
                        break
                    left = at
                    if ctl.lstrip:
                        while left > base and data[left - 1] in WHITESPACE:
                            left -= 1
                    if left > base:
                        out.append((base, left))
                    out.append(text)
                    right = at + len(text)
                    if ctl.rstrip:
                        while right < end and data[right] in WHITESPACE:
                            right += 1
                    if right >= end:
                        break
                    base = right
            frags = out
        return frags

    def _written(self, data: bytes, markup: Sequence[Span]) -> list[bytes]:
        """The control texts written in the markup, in the order of llama.cpp's passes: longest
        first (equal lengths by text)."""
        if not self._by_text:
            return []
        found: set[bytes] = set()
        for a, b in markup:
            for m in self._starts.finditer(data, a, b):
                t = m.group(1)
                if t not in found:
                    found.add(t)
                    found.update(self._prefixes[t])
        return sorted(found, key=lambda t: (-len(t), t))


def _complement(spans: Sequence[Span], n: int) -> list[Span]:
    out, at = [], 0
    for a, b in spans:
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < n:
        out.append((at, n))
    return out


def _find_in(data: bytes, text: bytes, base: int, end: int, markup: Sequence[Span], starts: list[int]) -> int:
    """The first occurrence of ``text`` inside ``[base, end)`` that lies wholly in one markup span."""
    i = max(0, bisect.bisect_right(starts, base) - 1)
    while i < len(markup):
        a, b = markup[i]
        if a >= end:
            break
        lo, hi = max(a, base), min(b, end)
        if hi - lo >= len(text):
            at = data.find(text, lo, hi)
            if at >= 0:
                return at
        i += 1
    return -1
