"""Full scoring on SmolLM2-135M-Instruct: whole multi-token answers to easy questions.

A sanity check that the summed log-prob of every token ranks the right answer first where a
135M model knows it (margins of 2.8 to 4.1 nats measured here), including choices that all
start with the same token, which first-token scoring refuses.
"""

from __future__ import annotations

import pytest

from bmoe.decide.types import DecideRequest

EASY = [
    ("Who wrote Romeo and Juliet?", ("Charles Dickens", "William Shakespeare", "Mark Twain"), 1),
    ("What is the largest ocean on Earth?", ("The Arctic Ocean", "The Indian Ocean", "The Pacific Ocean"), 2),
    ("What color is the sky on a clear day? Answer in two words.", ("Bright green", "Light blue", "Deep purple"), 1),
]


@pytest.mark.parametrize(("question", "choices", "gold"), EASY, ids=["shakespeare", "pacific", "sky"])
def test_full_scoring_picks_the_right_multi_token_answer(open_smol, question: str, choices, gold: int) -> None:
    s = open_smol(decide=True, decide_batch=4)
    r = s.decide(DecideRequest(id=1, prefix="", suffix=question, choices=choices, scoring="full"))
    assert r.error is None, r.error
    assert min(r.scores.choice_tokens) >= 2
    assert r.scores.best == gold, r.scores.choice_logp
    runner_up = max(x for i, x in enumerate(r.scores.choice_logp) if i != gold)
    assert r.scores.choice_logp[gold] - runner_up > 1.0
    if question.startswith("What is the largest"):
        first = s.decide(DecideRequest(id=2, prefix="", suffix=question, choices=choices))
        assert first.refused and "both start with token" in first.error
