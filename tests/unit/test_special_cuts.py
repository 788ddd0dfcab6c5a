"""The cuts of a long text (bmoe.llama.special_cuts) against a transcription of llama.cpp's split
at special tokens (``llama_vocab::impl::tokenizer_st_partition``): for every order llama.cpp may
take equally long special tokens in, the pieces' fragments, end to end, are the whole text's, and
each piece but the last ends in a special token (so no raw text spans a cut)."""

from __future__ import annotations

import random

import pytest

from bmoe.llama.special_cuts import Cutter, Special
from helpers.special_cuts import partition


def llama_orders(specials: list[tuple[bytes, bool, bool]], rng: random.Random, n: int) -> list[list]:
    """Orders llama.cpp may take the tokens in: longest first, equal lengths in any order."""
    orders = []
    for _ in range(n):
        shuffled = specials[:]
        rng.shuffle(shuffled)
        orders.append(sorted(shuffled, key=lambda s: len(s[0]), reverse=True))  # stable: ties stay shuffled
    return orders


def check(data: bytes, specials: list[tuple[bytes, bool, bool]], cuts: list[int], rng: random.Random) -> None:
    bounds = [0, *cuts, len(data)]
    assert bounds == sorted(set(bounds)), "cuts increase strictly, inside the text"
    for order in llama_orders(specials, rng, 4):
        whole = partition(data, order)
        pieces = [partition(data[i:j], order) for i, j in zip(bounds, bounds[1:])]
        for piece in pieces[:-1]:
            assert piece and piece[-1][0] == "tok", (data, cuts, piece)
        assert [f for piece in pieces for f in piece] == whole, (data, cuts, order)


# Special tokens that overlap each other (prefixes, suffixes, one inside another), share a text
# with different strips, start or end with whitespace, and strip on either side.
VOCABS = [
    [(b"<s>", False, False), (b"</s>", False, False), (b"<|im_start|>", False, False)],
    [
        (b"<a>", False, False),
        (b"<a", False, False),
        (b"a>", False, False),
        (b"<ab>", False, False),
        (b"b<", False, False),
        (b"ab", False, False),
    ],
    [(b"<m>", True, True), (b"<n>", False, True), (b"<o>", True, False), (b"<p>", False, False)],
    [(b"<x>", False, True), (b"<x>", False, False), (b"<y>", False, False)],
    [(b" <w> ", False, False), (b"\t\t", False, False), (b"<w>", False, True), (b"<v>", False, False)],
    [(b"aa", False, False), (b"aaa", False, False), (b"<z>", True, True)],
]


@pytest.mark.parametrize("vocab", range(len(VOCABS)))
def test_cuts_give_the_whole_texts_fragments(vocab: int) -> None:
    specials = VOCABS[vocab]
    cutter = Cutter(Special(t, r) for t, _, r in specials)
    rng = random.Random(vocab)
    alphabet = [b"a", b"b", b"<", b">", b" ", b"\n", b"\t", b"x", b"|"] + [s[0] for s in specials] * 3
    n_cut = 0
    for _ in range(400):
        data = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
        cuts = cutter.cuts(data, piece_bytes=1)
        n_cut += len(cuts)
        check(data, specials, cuts, rng)
    assert n_cut > 100, "the texts were cut (else the check proves nothing)"


def test_cuts_are_a_piece_apart_and_skip_overlapped_tokens() -> None:
    # "x<s" and "<s>" are as long as each other: where they overlap, llama.cpp's order decides
    # which one it takes, so no cut there; the lone "<s>" further on is a cut.
    specials = [(b"<s>", False, False), (b"x<s", False, False)]
    cutter = Cutter(Special(t, r) for t, _, r in specials)
    assert cutter.cuts(b"x<s>" * 100, piece_bytes=1) == []
    data = b"x<s>yy<s>zz" * 50
    cuts = cutter.cuts(data, piece_bytes=20)
    assert cuts and all(b - a >= 20 for a, b in zip([0, *cuts], cuts))
    assert all(data[c - 4 : c] == b"yy<s>"[1:] for c in cuts)
    check(data, specials, cuts, random.Random(0))


def test_short_or_special_free_texts_are_not_cut() -> None:
    cutter = Cutter([Special(b"<s>", False)])
    assert cutter.cuts(b"<s>" * 10, piece_bytes=100) == []  # shorter than a piece
    assert cutter.cuts(b"hello " * 1000, piece_bytes=100) == []  # nothing to cut after
    assert cutter.cuts(b"<s>" * 1000, piece_bytes=300) == [300, 600, 900, 1200, 1500, 1800, 2100, 2400, 2700]
    assert Cutter([]).cuts(b"<s>" * 1000, piece_bytes=1) == []
    assert Cutter([Special(b"", False), Special(b"<s>", False)]).cuts(b"<s>" * 1000, piece_bytes=1) == []


def test_rstrip_cut_goes_past_the_whitespace_it_strips() -> None:
    cutter = Cutter([Special(b"<e>", True)])
    data = b"<e>  \n" * 10
    cuts = cutter.cuts(data, piece_bytes=1)
    assert cuts == [6 * i for i in range(1, 10)]
    check(data, [(b"<e>", False, True)], cuts, random.Random(0))
