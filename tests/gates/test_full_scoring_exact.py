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
from helpers.decide_prompts import ABC, P1, S1, S2

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
        assert r.score_tokens == sum(n - 1 for n in sc.choice_tokens) + sum(n - 1 for n in sc.choice_tokens) + len(
            alone.decider.decider.text.tokenize_prompts([alone.decider.decider.text.render_user("Answer:")])[0]
        )
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


def worst_against_whole(s, prompt: list[int], choices, sc) -> float:
    """The largest difference, in nats, between full scoring's per-token log-probs of each choice
    and the same tokens' log-probs in one prefill of the prompt and that choice (perplexity)."""
    worst = 0.0
    for i, c in enumerate(choices):
        toks = s.decider.decider.text.tokenize_choice(c)
        whole = s.perplexity(tokens=prompt + toks, n_window=len(prompt) + len(toks))
        worst = max(worst, float(np.max(np.abs(whole.token_logprobs[-len(toks) :] - sc.choice_token_logp[i]))))
    return worst


@pytest.mark.parametrize("arch", ARCHS)
def test_g20c_full_scores_equal_one_whole_prefill_within_tolerance(tiny_models, open_session, arch: str) -> None:
    s = open_session(tiny_models(arch, "q8_0"), decide=True, decide_batch=4, flash_attn=False)
    text = s.decider.decider.text
    prompt = list(split_prompt(text, P1, S1).tokens)
    for reuse in (True, False):  # the prompt as prefix + rest, or whole
        sc = scores(s.decide(full(reuse_prefix=reuse)))
        worst = worst_against_whole(s, prompt, CHOICES, sc)
        assert worst < 1e-4, (reuse, worst)


@pytest.mark.parametrize("arch", ARCHS)
def test_g20d_the_session_is_left_as_a_first_token_decision_leaves_it(tiny_models, open_session, arch: str) -> None:
    model = tiny_models(arch, "q8_0")
    s = open_session(model, decide=True, decide_batch=2)
    plain = open_session(model, decide=True, decide_batch=2)
    first = DecideRequest(id=2, prefix=P1, suffix=S1, choices=ABC)
    assert scores(s.decide(full(unconditional="")))
    assert s.kv.n_past == len(split_prompt(s.decider.decider.text, P1, S1).tokens)
    plain.decide(first)
    nxt = DecideRequest(id=3, prefix=P1, suffix=S2, choices=ABC)
    a, b = s.decide(nxt), plain.decide(nxt)
    assert a.reuse == b.reuse == "restored" and scores(a) == scores(b)

    none = open_session(model, decide=True, decide_batch=1)  # no side sequences, ever
    r = none.decide(full())
    assert r.refused and "--decide-batch auto (the default) or 2 or more" in r.error
    assert scores(none.decide(first)) == scores(open_session(model, decide=True, decide_batch=1).decide(first))


# G20a on a real model: choices of 2, 5, 2 and 3 tokens (their lists on the side sequences: 1, 4,
# 1, 2 tokens). Before bmoe packed calls by the kernels a list's width selects
# (bmoe.runtime.forks.width_class), a one-token list padded to four was computed by other kernels
# than alone: 0.22 nats on "Lyon"'s second token with flash attention off. With flash attention on
# and two threads, one token of one sequence alone after more than 256 tokens has its KV cells
# split over the threads, which no wider or shared ubatch does: the long prefix puts the choices
# past that bound (0.17 nats on "Nice" before). A one-token list is now padded to two, alone or not.
SMOL_CHOICES = ("Lyon", "Marseille city centre", "Nice", "Strasbourg")
SMOL_SHORT = ("Answer the question.", " What is the capital of France?")
SMOL_LONG = ("You answer questions about the geography of Europe. " * 30, " Which French city is the second largest?")


@pytest.mark.parametrize(
    ("flash_attn", "threads", "prompt"),
    [(False, 1, SMOL_SHORT), (True, 2, SMOL_LONG)],
    ids=["fa-off", "fa-on-2-threads-long"],
)
def test_g20a_smollm2_mixed_choice_lengths(open_session, flash_attn: bool, threads: int, prompt) -> None:  # noqa: ANN001
    from bmoe.testing import smollm2_gguf_path

    kw = dict(chat="chatml", decide=True, decide_batch=4, flash_attn=flash_attn, n_threads=threads)
    s = open_session(smollm2_gguf_path(), **kw)
    alone = open_session(smollm2_gguf_path(), **kw)
    req = dict(prefix=prompt[0], suffix=prompt[1], scoring="full")
    r = s.decide(DecideRequest(id=1, choices=SMOL_CHOICES, **req))
    sc = scores(r)
    assert sc.choice_tokens == (2, 5, 2, 3) and (r.n_tokens > 256) == (prompt is SMOL_LONG)  # the premise (above)
    for i, c in enumerate(SMOL_CHOICES):
        a = scores(alone.decide(DecideRequest(id=2, choices=(c,), **req)))
        assert a.choice_token_logp[0] == sc.choice_token_logp[i], c


def test_g20c_smollm2_two_token_choices_equal_one_whole_prefill(open_session) -> None:
    """G20c on SmolLM2 with flash attention off, choices of 2-5 tokens: a two-token choice has one
    token to prefill, and one token alone in its ubatch takes other kernels than inside a wider
    piece (llamafile's GEMM declines one column; bmoe.runtime.forks.width_class): 0.22 nats on
    "Lyon" before such a list was padded to two tokens."""
    from bmoe.testing import smollm2_gguf_path

    s = open_session(smollm2_gguf_path(), chat="chatml", decide=True, decide_batch=4, flash_attn=False)
    text = s.decider.decider.text
    prompt = list(split_prompt(text, *SMOL_SHORT).tokens)
    for reuse in (True, False):  # the prompt as prefix + rest, or whole
        sc = scores(
            s.decide(
                DecideRequest(
                    id=1,
                    prefix=SMOL_SHORT[0],
                    suffix=SMOL_SHORT[1],
                    choices=SMOL_CHOICES,
                    scoring="full",
                    reuse_prefix=reuse,
                )
            )
        )
        worst = worst_against_whole(s, prompt, SMOL_CHOICES, sc)
        assert worst < 1e-4, (reuse, worst)
