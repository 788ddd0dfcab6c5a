"""SmolLM2's tokenizer on long texts: bmoe tokenizes a text full of special tokens in pieces
(bmoe.llama.special_cuts), which must give exactly llama.cpp's tokens of the whole text, in time
linear in the text (llama.cpp alone is quadratic in the number of special tokens written in it)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Iterator

import llama_cpp
import pytest

from bmoe.llama.model import LlamaModel, ModelLoadParams

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<repo_name>",
    "<file_sep>",
    "<gh_stars>",
    "<jupyter_output>",
    "<empty_output>",
]


@pytest.fixture(scope="module")
def model(smollm2_path: Path) -> Iterator[LlamaModel]:
    m = LlamaModel(ModelLoadParams(path=smollm2_path))
    yield m
    m.close()


def whole(model: LlamaModel, text: str, add_special: bool, parse_special: bool) -> list[int]:
    """llama.cpp's tokens of the whole text in one call."""
    data = text.encode()
    cap = len(data) + 8
    buf = (llama_cpp.llama_token * cap)()
    n = llama_cpp.llama_tokenize(model.vocab, data, len(data), buf, cap, add_special, parse_special)
    assert n >= 0
    return list(buf[:n])


def texts() -> list[str]:
    rng = random.Random(31)
    words = [
        "hello",
        " world",
        "\n",
        "  ",
        "\t",
        "über",
        "中文",
        "😀",
        "1234",
        "<|im_start",
        "im_end|>",
        "<",
        ">",
        "|",
        "user",
        "assistant",
        " ",
        "\n\n",
        "'s",
        "x",
    ]
    mixed = "".join(rng.choice(words + SPECIALS) for _ in range(12000))
    chat = "".join(
        f"<|im_start|>user\nQuestion {i}: what is {i} + {i}?<|im_end|>\n"
        f"<|im_start|>assistant\nIt is {2 * i}.<|im_end|>\n"
        for i in range(600)
    )
    return [
        "<|im_start|>" * 5000,
        "<|im_end|>\n" * 5000,
        "a<|im_start|>" * 4000,
        "<|im_start|> " * 4000,
        " <|im_end|>" * 4000,
        "".join(SPECIALS) * 500,
        chat,
        mixed,
        "plain text with no special token at all. " * 1500,
        "<|im_start" * 6000 + "|>",  # almost-special text
    ]


@pytest.mark.parametrize("i", range(len(texts())))
def test_pieces_give_the_whole_texts_tokens(model: LlamaModel, i: int) -> None:
    text = texts()[i]
    for add_special in (False, True):
        for parse_special in (True, False):
            assert model.tokenize(text, add_special=add_special, parse_special=parse_special) == whole(
                model, text, add_special, parse_special
            ), (i, add_special, parse_special)


def test_texts_with_special_tokens_are_cut(model: LlamaModel) -> None:
    """The check above compares pieces, not a whole text tokenized twice."""
    cutter = model._cutter(True)
    for text in texts()[:8]:
        assert cutter.cuts(text.encode()), text[:40]


def _seconds(model: LlamaModel, text: str) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        model.tokenize(text, add_special=False, parse_special=True)
        best = min(best, time.perf_counter() - t0)
    return best


@pytest.mark.parametrize("unit", ["<|im_end|>\n", "a<|im_start|>", "<|im_start|>"])
def test_tokenizing_is_linear_in_the_text(model: LlamaModel, unit: str) -> None:
    """Twice the text takes about twice the time (llama.cpp alone: 4 to 4.5 times at 100 -> 200 KB)."""
    model.tokenize(unit * 1000, add_special=False, parse_special=True)  # warm: the vocabulary's specials
    small = unit * (100_000 // len(unit))
    t_small, t_large = _seconds(model, small), _seconds(model, small * 2)
    assert t_large <= 3 * t_small, f"{t_small:.3f}s for {len(small)} B, {t_large:.3f}s for twice that"
