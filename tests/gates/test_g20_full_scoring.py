"""G20: full scoring (``scoring="full"``) scores every token of every choice exactly.

Each choice's tokens go on their own side sequence, forked from the prompt's state, several
choices in one llama_decode (padded to one ubatch). Checked on the tiny qwen3moe and the hybrid
qwen35moe in Q8_0, resident and streamed:

a. a choice scored among others equals the same choice scored alone (a request with only that
   choice, in a session of the same settings), bit for bit: the same pieces, and Q8_0's kernels
   compute a row the same however many rows share its ubatch (docs/decide.md "What is exact").
   The session has two side sequences, so five choices also take several decodes. Streamed
   equals resident, bit for bit.
b. the same after a neutral prompt (``unconditional``), whether its state was just prefilled,
   restored for new choices or its scores remembered.
c. against the prompt and the choice prefilled as one piece (perplexity over the tokens), with
   flash attention off: within 1e-4 nats per token (0.0 measured on this machine for both
   models; differently chunked prefills round differently with llama.cpp's CPU flash attention,
   so the default ``auto`` is not held to it).
d. the sequence and the kept prefix state are left as a first-token decision leaves them, and a
   session without side sequences (``decide_batch`` 1) refuses full scoring and stays usable.
   (With the default ``decide_batch`` auto, full scoring opens them: G21b.)
"""
from __future__ import annotations

import numpy as np
import pytest

from bmoe.decide.prompt_split import split_prompt
from bmoe.decide.types import DecideRequest

from decide_prompts import ABC, P1, S1, S2

# The two hand-written fixtures, a plain MoE and a recurrent hybrid (the shared list of every
# converted architecture would make this gate take minutes; G18/G19 cover those).
ARCHS = ["qwen3moe", "qwen35moe"]

CHOICES = ("Open Settings", "A", "Open the camera app now please", "Call Mom", " Settings")
MODES = {"resident": {}, "stream-nocache": {"moe_stream": True, "cache_mb": 0}}


def full(choices: tuple[str, ...] = CHOICES, suffix: str = S1, **kw: object) -> DecideRequest:
    return DecideRequest(id=1, prefix=P1, suffix=suffix, choices=choices, scoring="full", **kw)  # type: ignore[arg-type]


def scores(r):
    assert r.error is None, r.error
    return r.scores


@pytest.mark.parametrize("arch", ARCHS)
def test_g20ab_a_choice_among_others_equals_it_alone(tiny_models, open_session, arch: str) -> None:
    model = tiny_models(arch, "q8_0")
    got = {}
    for mode, kw in MODES.items():
        s = open_session(model, decide=True, decide_batch=2, **kw)
        alone = open_session(model, decide=True, decide_batch=2, **kw)
        r = s.decide(full(unconditional="Answer:"))
        sc = scores(r)
        assert sc.choice_tokens[1] == 1 and max(sc.choice_tokens) > 3  # one-token and long choices
        assert r.score_tokens == sum(n - 1 for n in sc.choice_tokens) + sum(n - 1 for n in sc.choice_tokens) + \
            len(alone.decider.backend.tokenize_prompts([alone.decider.backend.render_user("Answer:")])[0])
        assert r.uncond_reuse == "stored"
        for i, c in enumerate(CHOICES):
            a = scores(alone.decide(full((c,), unconditional="Answer:")))
            assert a.choice_token_logp[0] == sc.choice_token_logp[i], (mode, c)
            assert a.choice_logp_neutral[0] == sc.choice_logp_neutral[i], (mode, c)
        # the neutral side restored for new choices, then remembered: the same numbers
        again = s.decide(full(CHOICES[::-1] + ("Hotspot",), suffix=S2, unconditional="Answer:"))
        assert again.uncond_reuse == "restored"
        assert scores(again).choice_logp_neutral[:5] == sc.choice_logp_neutral[::-1]
        cached = s.decide(full(CHOICES[:2], suffix=S2, unconditional="Answer:"))
        assert cached.uncond_reuse == "cached" and scores(cached).choice_logp_neutral == sc.choice_logp_neutral[:2]
        got[mode] = (sc, scores(again))
    assert got["resident"] == got["stream-nocache"]


@pytest.mark.parametrize("arch", ARCHS)
def test_g20c_full_scores_equal_one_whole_prefill_within_tolerance(tiny_models, open_session, arch: str) -> None:
    s = open_session(tiny_models(arch, "q8_0"), decide=True, decide_batch=4, flash_attn=False)
    backend = s.decider.backend
    prompt = list(split_prompt(backend, P1, S1).tokens)
    for reuse in (True, False):  # the prompt as prefix + rest, or whole
        sc = scores(s.decide(full(reuse_prefix=reuse)))
        worst = 0.0
        for i, c in enumerate(CHOICES):
            toks = backend.tokenize_choice(c)
            whole = s.perplexity(tokens=prompt + toks, n_window=len(prompt) + len(toks))
            worst = max(worst, float(np.max(np.abs(whole.token_logprobs[-len(toks):] - sc.choice_token_logp[i]))))
        assert worst < 1e-4, (reuse, worst)


@pytest.mark.parametrize("arch", ARCHS)
def test_g20d_the_session_is_left_as_a_first_token_decision_leaves_it(tiny_models, open_session, arch: str) -> None:
    model = tiny_models(arch, "q8_0")
    s = open_session(model, decide=True, decide_batch=2)
    plain = open_session(model, decide=True, decide_batch=2)
    first = DecideRequest(id=2, prefix=P1, suffix=S1, choices=ABC)
    assert scores(s.decide(full(unconditional="")))
    assert s.kv.n_past == len(split_prompt(s.decider.backend, P1, S1).tokens)
    plain.decide(first)
    nxt = DecideRequest(id=3, prefix=P1, suffix=S2, choices=ABC)
    a, b = s.decide(nxt), plain.decide(nxt)
    assert a.reuse == b.reuse == "restored" and scores(a) == scores(b)

    none = open_session(model, decide=True, decide_batch=1)  # no side sequences, ever
    r = none.decide(full())
    assert r.refused and "--decide-batch auto (the default) or 2 or more" in r.error
    assert scores(none.decide(first)) == scores(open_session(model, decide=True, decide_batch=1).decide(first))
