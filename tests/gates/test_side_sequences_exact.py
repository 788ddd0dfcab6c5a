"""G21: side sequences opened when a plain ``--decide`` session first needs them change no answer.

With ``decide_batch`` auto (the default) a session opens with one sequence. The first batch of
decisions that share a prefix, or the first full-scored decision, re-creates the context with
k side sequences (k = 8, fewer where their KV does not fit in half of the memory the process may
still allocate; here a fake ``Runtime.available_bytes`` fixes k). The KV is lost, so the kept
prefix state is dropped first; the next decision prefills its prefix again.

What is bit for bit: a decision answered before the context was re-created and the same decision
after it, on the n_seq = k+1 context, prefilled in the same pieces (its prefix, then the rest):
each sequence has its own KV stream of n_ctx cells and computes as a one-sequence context does.
A batch there equals the same decisions one by one (G19's rule, Q8_0), and full scoring equals
the same request on a session opened with its side sequences (G20's rule, Q8_0). Checked on the
tiny qwen3moe and hybrid qwen35moe in Q8_0, resident and streamed (the same ExpertHook serves the
new context).
"""

from __future__ import annotations

import pytest

from bmoe.decide.types import DecideRequest
from bmoe.runtime.footprint import kv_bytes_per_sequence
from bmoe.runtime.results import GenerateRequest
from helpers.decide_prompts import ABC, P1, P2, S1, S2, S3, modes_of

ARCHS = ["qwen3moe", "qwen35moe"]
MODES = {"resident": {}, "stream-nocache": {"moe_stream": True, "cache_mb": 0}}
N_CTX = 512  # the gates' open_session default
FULL = ("Open Settings", "A", "Call Mom now please")


def fits(model, n: int) -> int:  # noqa: ANN001
    """An available_bytes() whose half holds exactly ``n`` side sequences' KV (and not n + 1)."""
    kv = kv_bytes_per_sequence(model, N_CTX, False)
    return 2 * n * kv + kv


def answer(r):  # noqa: ANN001
    assert r.error is None, r.error
    return r.scores.choice_logp, r.scores.p_outside, r.scores.best, r.n_tokens


def plain(i: int, suffix: str, prefix: str = P1) -> DecideRequest:
    return DecideRequest(id=i, prefix=prefix, suffix=suffix, choices=ABC)


@pytest.mark.parametrize(("arch", "mode"), [(a, m) for a in ARCHS for m in modes_of(a)])
def test_g21a_a_decision_answers_the_same_before_and_after_the_side_sequences_open(
    tiny_models, open_session, arch: str, mode: str
) -> None:
    """Streamed too, with an evicting cache and read-ahead where the arch allows it: the session's
    one ExpertHook serves the new context as it served the old."""
    model = tiny_models(arch, "q8_0")
    s = open_session(model, decide=True, **modes_of(arch)[mode])  # decide_batch auto
    s.runtime.available_bytes = lambda: fits(model, 3)
    assert s.runtime.ctx.n_seq == 1 and s.stats()["side_sequences"] == 0
    before = [s.decide(plain(1, S1)), s.decide(plain(2, S2))]  # stored, then restored: one by one
    assert [r.reuse for r in before] == ["stored", "restored"] and s.runtime.ctx.n_seq == 1
    # a single decision and a request list of one never open them
    assert s.decide_many([plain(3, S3)])[0].batch is None and s.runtime.ctx.n_seq == 1
    got = s.decide_many([plain(1, S1), plain(2, S2), plain(4, " Screen: Home.")])
    assert s.runtime.ctx.n_seq == 4 and s.stats()["side_sequences"] == 3
    # the kept state went with the old context: the batch stored its prefix again, in the same pieces
    assert got[0].reuse == "stored" and all(r.batch is not None and r.batch.size == 3 for r in got)
    assert [answer(r) for r in got[:2]] == [answer(r) for r in before]
    after = s.decide(plain(1, S1))
    assert after.reuse == "restored" and answer(after) == answer(before[0])
    # against a session that never re-created its context (its side sequences opened with it)
    fixed = open_session(model, decide=True, decide_batch=3, **modes_of(arch)[mode])
    assert [answer(fixed.decide(r)) for r in (plain(1, S1), plain(2, S2), plain(4, " Screen: Home."))] == [
        answer(r) for r in got
    ]


@pytest.mark.parametrize("arch", ARCHS)
def test_g21b_full_scoring_opens_them_and_scores_as_a_session_opened_with_them(
    tiny_models, open_session, arch: str
) -> None:
    model = tiny_models(arch, "q8_0")
    want = {}
    for mode, kw in MODES.items():
        s = open_session(model, decide=True, **kw)
        first = s.decide(plain(1, S1))
        assert s.runtime.ctx.n_seq == 1
        full = DecideRequest(id=2, prefix=P1, suffix=S1, choices=FULL, scoring="full", unconditional="Answer:")
        r = s.decide(full)
        assert r.error is None, r.error
        assert s.stats()["side_sequences"] == 8  # the tiny KV fits: DECIDE_BATCH_AUTO
        assert r.reuse == "stored"  # the prefix prefilled again after the context was re-created
        assert answer(s.decide(plain(1, S1))) == answer(first)
        fixed = open_session(model, decide=True, decide_batch=2, **kw)
        f = fixed.decide(full)
        assert r.scores.choice_token_logp == f.scores.choice_token_logp
        assert r.scores.choice_logp_neutral == f.scores.choice_logp_neutral
        want[mode] = r.scores
    assert want["resident"] == want["stream-nocache"]


def test_g21c_no_room_answers_one_by_one_and_refuses_full_scoring(tiny_models, open_session) -> None:
    model = tiny_models("qwen3moe", "q8_0")
    s = open_session(model, decide=True)
    s.runtime.available_bytes = lambda: fits(model, 0)
    alone = open_session(model, decide=True, decide_batch=1)
    reqs = [plain(1, S1), plain(2, S2), plain(3, S3, P2)]
    got = s.decide_many(reqs)
    assert s.runtime.ctx.n_seq == 1 and all(r.batch is None for r in got)
    assert [answer(r) for r in got] == [answer(alone.decide(r)) for r in reqs]
    full = s.decide(DecideRequest(id=4, prefix=P1, suffix=S1, choices=FULL, scoring="full"))
    kv_mib = kv_bytes_per_sequence(model, N_CTX, False) / 2**20
    assert full.refused and full.error == (
        'decide: "scoring": "full" scores each choice on a side sequence and none fits in memory: one takes '
        f"{kv_mib:.1f} MiB (the KV of a {N_CTX}-token sequence) and half of what this process may still allocate "
        f"is {fits(model, 0) // 2 / 2**20:.1f} MiB; free memory, or open the session with a smaller --ctx-size"
    )
    after = s.decide(plain(5, S2, P2))  # the session goes on, the kept state (P2's) untouched by the refusal
    assert after.reuse == "restored" and s.runtime.ctx.n_seq == 1
    # memory came back: the next batch opens them
    s.runtime.available_bytes = lambda: fits(model, 2)
    assert all(r.batch is not None for r in s.decide_many(reqs[:2])) and s.stats()["side_sequences"] == 2


def test_g21d_decide_batch_1_never_opens_them(tiny_models, open_session) -> None:
    model = tiny_models("qwen3moe", "q8_0")
    s = open_session(model, decide=True, decide_batch=1)
    got = s.decide_many([plain(1, S1), plain(2, S2)])
    assert all(r.batch is None and r.error is None for r in got) and s.runtime.ctx.n_seq == 1
    r = s.decide(DecideRequest(id=3, prefix=P1, suffix=S1, choices=FULL, scoring="full"))
    assert r.refused and r.error.endswith(
        "this session has none (--decide-batch 1): open it with --decide-batch auto (the default) or 2 or more "
        "(SessionConfig.decide_batch)"
    )
    assert s.stats()["side_sequences"] == 0


@pytest.mark.parametrize("mode", list(MODES))
def test_g21e_the_chat_goes_on_after_the_context_was_re_created(tiny_models, open_session, mode: str) -> None:
    """The history stays. The continued turn reuses what the KV holds after the batch (its kept
    prefix: the template's opening at most) and prefills the rest of the conversation, as in a
    session that had its side sequences from the start and saw the same requests."""
    model = tiny_models("qwen3moe", "q8_0")
    sessions = [
        open_session(model, decide=True, **MODES[mode]),
        open_session(model, decide=True, decide_batch=8, **MODES[mode]),
    ]
    turns = []
    for s in sessions:
        first = s.generate(GenerateRequest(prompt="Hello there.", keep_logits=True))
        batch = s.decide_many([plain(1, S1), plain(2, S2)])
        assert all(r.batch is not None for r in batch) and s.runtime.ctx.n_seq == 9
        assert [m.content for m in s.history] == ["Hello there.", first.text]
        turns.append((first, s.generate(GenerateRequest(prompt="And then?", clear_kv=False, keep_logits=True))))
    (first_a, a), (first_b, b) = turns
    assert first_a.tokens == first_b.tokens and all((x == y).all() for x, y in zip(first_a.logits, first_b.logits))
    assert a.n_reused == b.n_reused and a.n_prompt == b.n_prompt and a.tokens == b.tokens
    assert len(a.logits) == len(b.logits) > 0 and all((x == y).all() for x, y in zip(a.logits, b.logits))


def test_g21f_a_debiased_request_opens_them_for_its_permutations(tiny_models, open_session) -> None:
    """The n permutations of a "permute" request share the prompt's prefix: one request is enough
    to open the side sequences, and its debiased answer is the one answered one by one."""
    model = tiny_models("qwen3moe", "q8_0")
    r = DecideRequest(
        id=1,
        prefix=P1,
        suffix=" ",
        choices=(),
        question="Which is the smallest?",
        options=("22", "95", "86"),
        debias="permute",
    )
    s, alone = open_session(model, decide=True), open_session(model, decide=True, decide_batch=1)
    a, b = s.decide(r), alone.decide(r)
    assert a.error is None and s.stats()["side_sequences"] == 8 and alone.stats()["side_sequences"] == 0
    assert a.debias.debiased_p == b.debias.debiased_p and a.scores == b.scores and a.debias.decisions == 3


def test_g21g_a_refused_context_leaves_the_session_as_it_was(tiny_models, open_session, monkeypatch) -> None:
    """llama.cpp refusing the context with side sequences: the old shape is re-created, batches
    run one by one, full scoring is refused naming the failure, and nothing is tried again."""
    import bmoe.runtime.runtime as runtime_mod
    from bmoe.llama.context import ContextError

    real, tried = runtime_mod.LlamaContext, []

    def refusing(model, params, eval_callback=None):  # noqa: ANN001
        if params.n_seq > 1:
            tried.append(params.n_seq)
            raise ContextError(f"llama.cpp could not create a context of {params.n_ctx} tokens")
        return real(model, params, eval_callback=eval_callback)

    model = tiny_models("qwen3moe", "q8_0")
    s, alone = open_session(model, decide=True), open_session(model, decide=True, decide_batch=1)
    monkeypatch.setattr(runtime_mod, "LlamaContext", refusing)
    reqs = [plain(1, S1), plain(2, S2)]
    got = s.decide_many(reqs)
    assert tried == [9] and s.runtime.ctx.n_seq == 1 and all(r.batch is None for r in got)
    assert [answer(r) for r in got] == [answer(alone.decide(r)) for r in reqs]
    r = s.decide(DecideRequest(id=3, prefix=P1, suffix=S1, choices=FULL, scoring="full"))
    assert r.refused and r.error == (
        'decide: "scoring": "full" scores each choice on a side sequence and opening them failed: llama.cpp '
        f"could not create a context of 9 sequences of {N_CTX} tokens: llama.cpp could not create a context "
        f"of {N_CTX} tokens"
    )
    s.decide_many(reqs)
    assert tried == [9] and s.stats()["side_sequences"] == 0
