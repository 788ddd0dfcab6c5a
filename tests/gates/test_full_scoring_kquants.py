"""G20k: on K-quant weights, a full-scored choice among others scores bit for bit what it scores
alone (a request with only that choice), as G20a checks on Q8_0.

Choices are prefilled side by side on side sequences; each asks a row of logits per token, so a
call's products have as many rows as its choices' tokens. A choice of under 8 tokens alone stays
under the tiled K-quant matmul's 8 rows, and beside others can cross them (bmoe.runtime.forks,
RowLimits; docs/decide.md "What is exact"): the calls are bounded so that none does.
"""

from __future__ import annotations

import pytest

from bmoe.decide.types import DecideRequest
from helpers.decide_prompts import MODES, P1, S1

# 2 to 12 tokens: under and over 8, eight of them with more than one token (decide_batch 8)
CHOICES = (
    "Open Settings",
    "A",
    "Open the camera app now please",
    "Call Mom",
    " Settings",
    "Back",
    "Turn on Wi-Fi and then go back to the home screen",
    "Search",
    "Open the network settings page",
    "Battery saver",
)


def full(choices: tuple[str, ...]) -> DecideRequest:
    return DecideRequest(id=1, prefix=P1, suffix=S1, choices=choices, scoring="full")


@pytest.mark.parametrize("mode", ["resident", "stream-nocache"])
@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])
def test_g20k_k_quant_choice_among_others_equals_it_alone(tiny_models, open_session, arch: str, mode: str) -> None:
    model = tiny_models(arch, "q4_k_m")
    kw = dict(decide=True, decide_batch=8, **MODES[mode])
    among, alone = open_session(model, **kw), open_session(model, **kw)
    sc = among.decide(full(CHOICES)).scores
    assert min(sc.choice_tokens) == 1 and max(sc.choice_tokens) >= 9  # the premise: both sides of 8
    for i, c in enumerate(CHOICES):
        a = alone.decide(full((c,))).scores
        assert a.choice_token_logp[0] == sc.choice_token_logp[i], c
