"""Special tokens in a prompt's markup only (bmoe.llama.markup): llama.cpp's split at special
tokens, taking a control token only where its text lies wholly in the markup, against an oracle
that cannot see a control token in a message's text at all (its bytes are other symbols there),
and the check that decides whether the split is needed."""

from __future__ import annotations

import random

import pytest

from bmoe.llama.markup import Control, PlainReader
from helpers.special_cuts import partition

WS = b" \t\n\v\f\r"
PLAIN = 0x10000  # a message's byte b is the symbol chr(PLAIN + b): no control text can match it


def oracle(data: bytes, plain: list[tuple[int, int]], controls: list[Control]) -> list[tuple[int, int] | bytes]:
    """llama.cpp's partition (test_special_cuts's transcription, over symbols instead of bytes)
    of a text whose plain bytes are symbols no control text holds; whitespace strips as before."""
    syms = [chr(b) for b in data]
    for a, b in plain:
        for i in range(a, b):
            syms[i] = chr(PLAIN + data[i])
    text = "".join(syms)
    spaces = {chr(c) for c in WS} | {chr(PLAIN + c) for c in WS}
    order = sorted({c.text: c for c in reversed(controls)}.values(), key=lambda c: (-len(c.text), c.text))
    frags: list = [(0, len(text))] if text else []
    for c in order:
        tok = c.text.decode("latin-1")
        out: list = []
        for frag in frags:
            if isinstance(frag, bytes):
                out.append(frag)
                continue
            base, end = frag
            while True:
                at = text.find(tok, base, end)
                if at < 0:
                    out.append((base, end))
                    break
                left = at
                while c.lstrip and left > base and text[left - 1] in spaces:
                    left -= 1
                if left > base:
                    out.append((base, left))
                out.append(c.text)
                right = at + len(tok)
                while c.rstrip and right < end and text[right] in spaces:
                    right += 1
                if right >= end:
                    break
                base = right
        frags = out
    return frags


VOCABS = [
    [Control(b"<|im_start|>"), Control(b"<|im_end|>"), Control(b"<|endoftext|>")],
    [Control(b"<a>"), Control(b"<a"), Control(b"a>"), Control(b"<ab>"), Control(b"b<"), Control(b"ab")],
    [Control(b"<m>", True, True), Control(b"<n>", False, True), Control(b"<o>", True, False), Control(b"<p>")],
    [Control(b"aa"), Control(b"aaa"), Control(b"<z>", True, True)],
]


def _texts(vocab: list[Control], rng: random.Random, n: int):
    alphabet = [b"a", b"b", b"<", b">", b" ", b"\n", b"x", b"|"] + [c.text for c in vocab] * 3
    for _ in range(n):
        pieces = [
            b"".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 8))) for _ in range(rng.randrange(1, 6))
        ]
        data, plain, at = b"", [], 0
        for k, p in enumerate(pieces):
            if k % 2 and p:
                plain.append((at, at + len(p)))
            data, at = data + p, at + len(p)
        yield data, plain


@pytest.mark.parametrize("vocab", range(len(VOCABS)))
def test_partition_takes_control_tokens_in_the_markup_only(vocab: int) -> None:
    controls = VOCABS[vocab]
    reader = PlainReader(controls)
    rng = random.Random(vocab)
    n_skipped = 0
    for data, plain in _texts(controls, rng, 600):
        got = reader.partition(data, plain)
        assert got == oracle(data, plain, controls), (data, plain)
        n_skipped += sum(1 for a, b in plain for c in controls if c.text in data[a:b])
        if not plain:  # no message: llama.cpp's own split, as its transcription does it
            order = [(c.text, c.lstrip, c.rstrip) for c in sorted(controls, key=lambda c: (-len(c.text), c.text))]
            assert [("tok", f) if isinstance(f, bytes) else ("raw", data[f[0] : f[1]]) for f in got] == partition(
                data, order
            )
    assert n_skipped > 50, "messages held control texts (else the check proves nothing)"


def _touches(data: bytes, plain: list[tuple[int, int]], controls: list[Control]) -> bool:
    for c in controls:
        start = data.find(c.text)
        while start >= 0:
            if any(start < b and start + len(c.text) > a for a, b in plain):
                return True
            start = data.find(c.text, start + 1)
    return False


@pytest.mark.parametrize("vocab", range(len(VOCABS)))
def test_overlaps_finds_a_control_text_touching_a_message(vocab: int) -> None:
    controls = VOCABS[vocab]
    reader = PlainReader(controls)
    seen = set()
    for data, plain in _texts(controls, random.Random(100 + vocab), 600):
        want = _touches(data, plain, controls)
        seen.add(want)
        assert reader.overlaps(data, plain) == want, (data, plain)
    assert seen == {True, False}


def test_a_control_text_across_a_messages_edge_touches_it() -> None:
    reader = PlainReader([Control(b"<|im_end|>")])
    data = b"<|im_start|>user\nhi <|im_<|im_end|>"
    assert not reader.overlaps(data, [(17, 25)])  # "hi <|im_" then the markup's own token
    assert reader.overlaps(b"hi <|im_end|>", [(0, 6)])  # "hi <|i" + "m_end|>": a token across the edge
    assert reader.partition(b"hi <|im_end|>", [(0, 6)]) == [(0, 13)]  # not taken: plain text


def test_no_control_tokens_or_only_empty_ones() -> None:
    for reader in (PlainReader([]), PlainReader([Control(b"")])):
        assert not reader.overlaps(b"<s>abc", [(0, 6)])
        assert reader.partition(b"<s>abc", [(0, 6)]) == [(0, 6)]
        assert reader.partition(b"", []) == []
