"""G19: a batch of decisions prefilled together answers what each decision answers alone.

``decide_many`` on a session opened with ``decide_batch`` > 1 puts the decisions that keep the same
prefix side by side in one llama_decode, each suffix on its own KV stream forked from the kept
prefix. Compared here with the same decisions answered one by one (``decide``) in a session of the
same settings: the prefix piece is the same, and each suffix is one piece on a stream laid out as
the main sequence's is (but for one decision, whose prefix extends another's: see ``answers``).

Bit for bit on every weight type: Q8_0 and F32, whose matmul kernels compute each row the same
however many rows a ubatch holds, and K-quants (Q4_K_M), whose tiled kernel takes a product from 8
rows on: there the calls are bounded so that no product crosses that bound (bmoe.runtime.forks,
RowLimits; docs/decide.md "What is exact").
"""

from __future__ import annotations

import numpy as np
import pytest

from bmoe.decide.types import DecideRequest
from bmoe.stream.archs import batch_apart
from bmoe.testing import HF_KQUANT_ARCHS
from helpers.decide_prompts import ABC, FULL_ARCHS, P1, S1, S2, S3, SUFFIXES, answers, modes_of, requests
from helpers.decide_prompts import MODES as MODES_ALL


def near(a, b, tol: float = 0.5) -> None:  # noqa: ANN001
    """Decision 90 on both sides: the same tokens, log-probs within ``tol`` nats, the same best
    choice unless the top two are within ``tol`` of each other."""
    assert a.n_tokens == b.n_tokens and a.error is b.error is None
    la, lb = np.asarray(a.scores.choice_logp), np.asarray(b.scores.choice_logp)
    assert float(np.max(np.abs(la - lb))) < tol
    top2 = np.sort(la)[-2:]
    assert a.scores.best == b.scores.best or top2[1] - top2[0] < tol


@pytest.mark.parametrize(("arch", "mode"), [(a, m) for a in FULL_ARCHS for m in modes_of(a)])
def test_g19_batch_equals_one_by_one(tiny_models, open_session, arch: str, mode: str) -> None:
    model = tiny_models(arch, "q8_0")
    batched = open_session(model, decide=True, decide_batch=4, **modes_of(arch)[mode])
    alone = open_session(model, decide=True, decide_batch=4, **modes_of(arch)[mode])
    reqs = requests()
    got = batched.decide_many(reqs)
    want = [alone.decide(r) for r in reqs]
    assert answers(got) == answers(want)
    near(*[next(r for r in rs if r.id == 90) for rs in (got, want)])
    assert got[5].refused and got[3].batch is None and got[-1].batch is None
    apart = bool(batch_apart(arch))  # answered one by one (glm5-next: test_decide_batch_glm5next.py)
    # six decisions keep P1: a batch of 4, then one of 2 (decide_batch caps the sequences of a batch)
    sizes = sorted({(r.batch.id, r.batch.size) for r in got if r.batch is not None})
    assert [s for _, s in sizes] == ([] if apart else [4, 2])
    # afterwards both sessions keep the same prefix state: the next decision restores it the same
    nxt = DecideRequest(id=99, prefix=P1, suffix=" Screen: Lock.", choices=ABC)
    b_next, a_next = batched.decide(nxt), alone.decide(nxt)
    assert answers([b_next]) == answers([a_next]) and b_next.reuse == a_next.reuse == "restored"
    if modes_of(arch)[mode] and not apart:
        # streamed: the four suffixes of a batch read each routed expert once, not four times
        s_batch = [r for r in got if r.batch is not None and r.batch.size == 4]
        s_alone = [w for w, r in zip(want, got) if r.batch is not None and r.batch.size == 4]
        assert s_batch[0].batch.read_mb < sum(w.read_mb for w in s_alone[1:]) + s_alone[0].read_mb


@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
@pytest.mark.parametrize("mode", ["resident", "stream-nocache"])
def test_g19_rest_pieces_across_the_tiled_bound(tiny_models, open_session, mode: str, flash_attn: bool) -> None:
    """Short rest pieces batched with one of 64 tokens or more. Streamed, a batch is padded into
    one ubatch; padding the short ones to the long one's width would put them in flash
    attention's tiled kernel (64 query rows and more), which alone they do not take: 0.26 in a
    logit on the tiny qwen3moe. They go into a call of their own, the long one alone; resident,
    each call holds rest pieces of one length (bmoe.runtime.forks)."""
    model = tiny_models("qwen3moe", "q8_0")
    kw = dict(decide=True, decide_batch=4, flash_attn=flash_attn, **MODES_ALL[mode])
    batched, alone = open_session(model, **kw), open_session(model, **kw)
    reqs = [
        DecideRequest(id=i, prefix=P1, suffix=s, choices=ABC) for i, s in enumerate((S1, S1 + S2 + S3 + S2, S2, S3))
    ]
    got = batched.decide_many(reqs)
    want = [alone.decide(r) for r in reqs]
    rest = [r.n_tokens - r.n_reused for r in got[1:]]
    assert min(rest) < 64 <= max(rest) and {r.batch.size for r in got} == {4}  # the premise
    assert answers(got) == answers(want)


# The files whose experts really are K-quants (Q4_K, Q6_K: gate G23a). A converted 64-wide recipe's
# "q4_k_m" holds Q5_0 and Q8_0 experts: its rows are not whole 256-value K-quant blocks.
KQUANT_ARCHS = ["qwen3moe", "qwen35moe", *sorted(HF_KQUANT_ARCHS)]
# Sixteen suffixes of 10 to 71 tokens after P1: most experts get under 8 of a suffix's rows alone and
# 8 or more beside the others, where llama.cpp's tiled K-quant matmul takes over (bmoe.runtime.forks).
KQ_SUFFIXES = [
    *SUFFIXES,
    " Screen: Lock. Pick.",
    S1 + " Now.",
    " Screen: Wi-Fi.",
    S3 + " Go.",
    " A B C?",
    S2 + " Hurry up please.",
    " Screen: Display.",
    " Screen: Battery low.",
    S1 + S2,
    " Last one.",
]


@pytest.mark.parametrize(("arch", "n"), [(a, 8) for a in KQUANT_ARCHS] + [("qwen3moe", 16), ("qwen35moe", 16)])
@pytest.mark.parametrize("mode", ["resident", "stream-nocache"])
def test_g19_k_quant_batches_equal_one_by_one(tiny_models, open_session, arch: str, n: int, mode: str) -> None:
    """A K-quant batch of 8 and of 16 answers bit for bit what one by one does. Both sides run on
    this machine, so each takes whatever kernels its CPU has (AVX2, AVX-512): what is compared is
    whether a suffix beside others takes the kernels it takes alone. Before the calls were bounded
    by RowLimits, 0.09 nats apart on the tiny qwen3moe Q4_K_M (issue 38)."""
    from bmoe.runtime.forks import batch_limits

    model = tiny_models(arch, "q4_k_m")
    kw = dict(decide=True, decide_batch=n, **(MODES_ALL[mode] if arch in ("qwen3moe", "qwen35moe") else {}))
    batched, alone = open_session(model, **kw), open_session(model, **kw)
    reqs = [DecideRequest(id=i, prefix=P1, suffix=s, choices=ABC) for i, s in enumerate(KQ_SUFFIXES[:n])]
    got = batched.decide_many(reqs)
    want = [alone.decide(r) for r in reqs]
    assert batch_limits(model).experts  # the premise: the experts are of a tiled type
    assert all(r.batch is not None and r.batch.size == n for r in got)
    assert [(r.id, r.n_tokens, r.n_reused) for r in got] == [(r.id, r.n_tokens, r.n_reused) for r in want]
    assert answers(got) == answers(want)


def test_g19_decide_batch_refusals(tiny_models) -> None:
    from bmoe.config import SessionConfig
    from bmoe.errors import ConfigError

    model = tiny_models("qwen3moe", "q8_0")
    with pytest.raises(ConfigError, match="decide_batch: 4 needs decide on"):
        SessionConfig(model=model, decide_batch=4)
    with pytest.raises(ConfigError, match=r"decide_batch: must be auto or an integer in \[1, 255\], got 0"):
        SessionConfig(model=model, decide=True, decide_batch=0)


# G19 on a real model: rows of the shipped arithmetic set (data lines 53-56, whose rest pieces are
# 36, 38, 38 and 35 tokens under --chatml) and one longer decision (over 64 tokens) with the same
# prefix, batched together. llama.cpp's CPU kernels pick their attention path by how many tokens a
# sequence has in a ubatch (one; 2-63; 64 and more, where flash attention tiles the queries), so a
# batch that cut a rest piece into other pieces than alone (llama.cpp splits a multi-sequence call
# into ubatches that take as many tokens from each sequence), or padded it across such a bound,
# scored it differently: before that was fixed, 0.26 nats (the long one) and 0.13 (line 54) with flash
# attention off, 0.06 (the long one) with it on (issue 31).
ARITH_LINES = (53, 54, 55, 56)
LONG_SUFFIX = (
    " Before you answer, work out both sides in your head: add or subtract the tens first, then"
    " the units, and for a product multiply the two numbers digit by digit. Which expression"
    " is larger? Options: A) 47 + 38 B) 9 x 9. Answer with the letter."
)


def arithmetic_requests() -> list[DecideRequest]:
    from importlib import resources

    from bmoe.eval.dataset import parse_row

    lines = resources.files("bmoe.eval").joinpath("data/arithmetic.jsonl").read_text().splitlines()
    rows = [parse_row(lines[n - 1], n).request for n in ARITH_LINES]
    long = DecideRequest(id=99, prefix=rows[0].prefix, suffix=LONG_SUFFIX, choices=("A", "B"))
    return [rows[0], long, *rows[1:]]


@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
def test_g19_smollm2_rows_batched_equal_alone(open_session, flash_attn: bool) -> None:
    from bmoe.testing import smollm2_gguf_path

    kw = dict(chat="chatml", decide=True, decide_batch=5, flash_attn=flash_attn)
    batched = open_session(smollm2_gguf_path(), **kw)
    alone = open_session(smollm2_gguf_path(), **kw)
    reqs = arithmetic_requests()
    got = batched.decide_many(reqs)
    want = [alone.decide(r) for r in reqs]
    # the premise: one prefix piece on both sides, then each rest piece; mixed lengths on both
    # sides of the one-chunk/tiled bound, all in one batch
    rest = [r.n_tokens - r.n_reused for r in got[1:]]
    assert all(r.reuse == "restored" for r in got[1:] + want[1:]) and min(rest) < 64 <= max(rest)
    assert len({r.n_tokens for r in got}) >= 3 and {r.batch.size for r in got} == {5}
    assert answers(got) == answers(want)
