"""Where a long text can be cut so that tokenizing its pieces gives llama.cpp's tokens.

Before its tokenizer reads a text, llama.cpp splits it at the special tokens written in it
(``llama_vocab::impl::tokenizer_st_partition``): one pass per special token, longest text first,
over a linked list of fragments. Each split walks that list from its head, and each search runs
to the end of the whole text rather than of the fragment, so a text holding n special tokens
costs about n² steps: 200 KB of ``<|im_end|>\\n`` took 4.5 s on SmolLM2 and 1 MB about two
minutes, where 1 MB of plain text takes under a second. Tokenizing the text in pieces of a few
KB bounds each piece's n, so the whole costs time linear in the text.

A cut at ``q`` after an occurrence of the special token S at ``[a, p)`` gives the same tokens as
the whole text when:

1. S's text neither starts nor ends with whitespace;
2. S has no ``rstrip`` attribute and ``q == p``, or S has it and ``q`` ends the run of
   whitespace after ``p`` (llama.cpp strips that run from the fragment after an rstrip token);
3. no occurrence of a special token whose text is as long as S's or longer, other than S at
   ``a`` itself, overlaps ``[a, q)``.

Why: the passes before S's (texts as long or longer; among equal lengths llama.cpp's order is
unspecified, hence "as long") match only occurrences outside ``[a, q)`` (3), and their greedy,
leftmost scan of a fragment finds the same ones whether the fragment runs on past ``q`` or is
cut there, since none of them straddles the cut. Their whitespace strips stop at S's first and
last bytes (1), so when S's pass comes ``[a, p)`` is still inside one raw fragment, in the whole
text and in the piece before the cut alike, and S's own scan takes it (no other S overlaps it).
After S's pass no raw fragment spans the cut: the whole text's fragment list is the first
piece's list followed by the second's (2 makes the fragment after S start at ``q`` either way),
and every later pass, and the tokenizer itself, works on one fragment at a time. The one thing
a tokenizer carries from fragment to fragment, SentencePiece's space prefix after a special
token (and at the start of a text), holds at the cut too: the second piece starts right after a
special token. Shorter special tokens overlapping S do not matter: their passes come after S's.
tests/unit/test_special_cuts.py checks this against a transcription of llama.cpp's partition;
tests/real/test_smollm2_tokenize.py against SmolLM2's tokenizer itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

# What the C library's isspace() calls whitespace in the C locale (llama.cpp's strips use it).
WHITESPACE = frozenset(b" \t\n\v\f\r")

# The smallest piece worth cutting off: llama.cpp's cost is quadratic in a piece's special tokens,
# and a call costs a little (on SmolLM2 4 KiB pieces tokenize text dense with special tokens at
# about 1.7 s a MiB; 512 B to 8 KiB are all within 20% of it).
PIECE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Special:
    """One special token the partition looks for: its vocabulary text and whether llama.cpp
    strips the whitespace after it (``LLAMA_TOKEN_ATTR_RSTRIP``)."""

    text: bytes
    rstrip: bool


class Cutter:
    """The cut points of texts for one vocabulary's set of special tokens (those one
    ``parse_special`` setting partitions on)."""

    def __init__(self, specials: Iterable[Special]) -> None:
        rstrip: dict[bytes, bool | None] = {}  # None: two tokens share the text, one strips, one not
        for s in specials:
            rstrip[s.text] = s.rstrip if rstrip.get(s.text, s.rstrip) == s.rstrip else None
        self._rstrip = rstrip
        # An empty special text would match everywhere: never cut such a vocabulary's texts.
        self._usable = bool(rstrip) and b"" not in rstrip
        if self._usable:
            texts = sorted(rstrip, key=len, reverse=True)  # at each position, the longest first
            self._longest = max(len(t) for t in texts)
            alternatives = b"|".join(re.escape(t) for t in texts)
            self._find = re.compile(alternatives)
            self._starts = re.compile(b"(?=(" + alternatives + b"))")

    def cuts(self, data: bytes, piece_bytes: int = PIECE_BYTES) -> list[int]:
        """Cut positions (increasing, inside ``data``), each at least ``piece_bytes`` after the
        last, where cutting ``data`` gives the same tokens; empty where there is none."""
        if not self._usable or len(data) <= piece_bytes:
            return []
        out: list[int] = []
        last = 0
        at = max(0, piece_bytes - self._longest)  # a token starting here may end a piece long enough
        while (m := self._find.search(data, at)) is not None:
            at = m.start() + 1
            cut = self._cut_after(data, m.start(), m.group())
            if cut is None or cut - last < piece_bytes:
                continue
            if cut >= len(data):
                break
            out.append(cut)
            last = cut
            at = max(cut, cut + piece_bytes - self._longest)
        return out

    def _cut_after(self, data: bytes, a: int, s: bytes) -> int | None:
        """The cut after the longest special token ``s`` found at ``a``, or None where the
        conditions of the module's docstring do not hold there."""
        if s[0] in WHITESPACE or s[-1] in WHITESPACE:
            return None
        p = a + len(s)
        rstrip = self._rstrip[s]
        q = p
        if rstrip is None:  # the token llama.cpp takes may strip or not: cut only where that cannot matter
            if p < len(data) and data[p] in WHITESPACE:
                return None
        elif rstrip:
            while q < len(data) and data[q] in WHITESPACE:
                q += 1
        # Every special token starting where it could overlap [a, q): the longest at each
        # position (the lookahead gives one match per position, its first alternative).
        lo = max(0, a - self._longest + 1)
        for m in self._starts.finditer(data[lo : q + self._longest - 1]):
            start, length = lo + m.start(), len(m.group(1))
            if start >= q:
                break
            if start == a or length < len(s):
                continue  # S itself; a shorter token's pass comes after S's
            if start + length > a:  # starts before q and ends after a: it overlaps S's stretch
                return None
        return q
