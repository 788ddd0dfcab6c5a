"""G18a-f: decisions are exact where the design says they are (docs/decide.md).

Each gate runs on the tiny qwen3moe and the hybrid qwen35moe, resident and streamed
(cache off, and a cache small enough to evict). "Equal" means bit for bit: the same
float64 log-probs and the same float32 logit rows.
"""

import numpy as np
import pytest

from bmoe.decide.types import DecideRequest
from bmoe.errors import RequestError
from bmoe.runtime.results import GenerateRequest
from helpers.decide_prompts import ABC, ARCHS, FULL_ARCHS, P1, P2, S1, S2, S3, modes_of
from helpers.exactness import assert_same_up_to_near_tie
from helpers.gates import expert_bytes, record_routes

# The log-prob of a chosen token, computed in different pieces, agrees within this many nats on the
# tiny Q8_0 models (docs/testing.md "What a bit-exact test may compare"; 0 measured on both builds).
CHUNKING_TOL = 0.5


def req(i: int, prefix: str, suffix: str, **kw: object) -> DecideRequest:
    return DecideRequest(id=i, prefix=prefix, suffix=suffix, choices=ABC, **kw)


def logits_of(s) -> np.ndarray:
    return s.decider.decider.seq.last_logits().copy()


def opener(param, tiny_models, open_session):
    arch, mode = param
    model = tiny_models(arch, "q8_0")
    return lambda **kw: open_session(model, decide=True, **modes_of(arch)[mode], **kw)


def arch_modes(archs: list[str]) -> list[tuple[str, str]]:
    return [(a, m) for a in archs for m in modes_of(a)]


# The whole decide gate set runs on one architecture of each family; G18a, a core gate, on all.
@pytest.fixture(params=arch_modes(FULL_ARCHS), ids=lambda p: f"{p[0]}-{p[1]}")
def decider(request, tiny_models, open_session):
    return opener(request.param, tiny_models, open_session)


@pytest.fixture(params=arch_modes(ARCHS), ids=lambda p: f"{p[0]}-{p[1]}")
def any_decider(request, tiny_models, open_session):
    return opener(request.param, tiny_models, open_session)


def test_g18a_restored_prefix_equals_fresh(any_decider) -> None:
    a = any_decider()
    first = a.decide(req(1, P1, S1))
    restored = a.decide(req(2, P1, S2))
    assert (first.reuse, restored.reuse) == ("stored", "restored") and restored.n_reused > 0
    b = any_decider()
    fresh = b.decide(req(2, P1, S2))
    assert fresh.reuse == "stored" and fresh.n_reused == 0
    assert restored.scores.choice_logp == fresh.scores.choice_logp
    assert np.array_equal(logits_of(a), logits_of(b))


def test_g18b_state_stored_after_partial_restore_is_exact(decider) -> None:
    a = decider()
    a.decide(req(1, P1, S1))
    grown = a.decide(req(2, P2, S3))
    assert grown.reuse == "restored+stored"
    again = a.decide(req(3, P2, S3))  # restores the state stored after the partial restore
    assert again.reuse == "restored" and again.n_reused > grown.n_reused > 0
    b = decider()
    b.decide(req(1, P1, S1))
    computed = b.decide(req(2, P2, S3))  # the same pieces: P1 | P2 rest | suffix
    assert again.scores.choice_logp == computed.scores.choice_logp == grown.scores.choice_logp
    assert np.array_equal(logits_of(a), logits_of(b))


@pytest.mark.parametrize("overwrite", ["opted-out decision", "perplexity"])
def test_g18b_kept_state_overwritten_in_the_sequence_restores_exactly(decider, overwrite) -> None:
    """Attention-only models keep the prefix state in the sequence, uncopied; whatever overwrites
    the sequence first copies it out, and the copy restores bit for bit. Hybrid models copy at
    once; the same sequence of calls must hold for them too."""
    a = decider()
    first = a.decide(req(1, P1, S1))
    hybrid = a.model.is_hybrid
    assert (first.prefix_state_mib > 0) == hybrid  # in the sequence: no copy yet, no RAM
    if overwrite == "perplexity":
        a.perplexity(P2 + S3)
        assert a.decider.decider.seq.held_bytes > 0  # copied out before the KV was cleared
    else:
        whole = a.decide(req(2, P2, S3, reuse_prefix=False))
        assert whole.reuse == "opted out" and whole.prefix_state_mib > 0
        assert (whole.store_s > 0) == (not hybrid)  # the copy is this call's store
    restored = a.decide(req(3, P1, S2))
    assert restored.reuse == "restored" and restored.n_reused > 0
    assert restored.store_s == 0.0  # a copy perplexity() forced is timed in no answer (docs/decide.md)
    b = decider()
    fresh = b.decide(req(3, P1, S2))
    assert restored.scores.choice_logp == fresh.scores.choice_logp
    assert np.array_equal(logits_of(a), logits_of(b))


def test_g18b_prefix_state_mib_counts_every_state_buffer(decider) -> None:
    """prefix_state_mib is every byte the adapter holds for the kept state, and an in-sequence
    state leaves no copy behind. Each copy goes into a buffer a quarter larger than the state, so
    that a grown prefix usually fits it."""
    a = decider()
    seq = a.decider.decider.seq
    copies = a.model.is_hybrid or a.model.is_recurrent  # copied at the boundary, not kept in place
    out = [a.decide(req(1, P1, S1))]
    s1 = a.decider.decider.store.kept.state  # the P1 state: a copy, or a promise of one while in the sequence
    out.append(a.decide(req(2, P2, S3, reuse_prefix=False)))  # attention-only: copies it out now
    n1 = s1.nbytes  # the copy now exists on every arch
    out.append(a.decide(req(3, P2, S3)))  # restores it and stores the grown prefix
    n3 = a.decider.decider.store.kept.state.nbytes  # 0 while it lives in the sequence
    assert [r.reuse for r in out] == ["stored", "opted out", "restored+stored"] and n1 > 0
    if copies:  # the grown state's buffer and, as the spare for the next store, the one before it
        held = [n1 + n1 // 4] * 2 + [n1 + n1 // 4 + n3 + n3 // 4]
        assert n3 > n1
    else:  # the grown prefix lives in the sequence: the copy of the one before it is freed
        held = [0, n1 + n1 // 4, 0]
        assert n3 == 0
    assert seq.held_bytes == held[-1]
    assert [r.prefix_state_mib for r in out] == [h / 2**20 for h in held]


def test_g18c_whole_prefill_equals_perplexity(decider) -> None:
    """Both sides are one prefill of the prompt into an empty KV, so the scored row has the same
    tokens, positions and ubatch start; perplexity's piece is one token longer and keeps every
    row. The kernels used here compute that row the same either way (checked on the AVX2 and the
    AVX-512 builds, docs/testing.md). The premise is asserted: with a prompt of n_ubatch tokens,
    perplexity's extra token would go into a second ubatch."""
    s = decider()
    whole = s.decide(req(1, P2, S3, reuse_prefix=False))
    assert whole.reuse == "opted out" and whole.n_reused == 0
    prompt = s.tokenize_prompt(s.decider.decider.text.render_user(P2 + S3))
    assert len(prompt) == whole.n_tokens
    assert len(prompt) + 1 <= min(s.config.n_batch, s.config.n_ubatch)  # one ubatch on both sides
    for i, choice in enumerate(ABC):
        first = s.model.tokenize(choice, add_special=False, parse_special=False)[0]
        pp = s.perplexity(tokens=prompt + [first], n_window=len(prompt) + 1)
        assert pp.token_logprobs[-1] == whole.scores.choice_logp[i]


def test_g18e_generate_after_decisions_equals_one_that_never_saw_them(decider) -> None:
    a = decider()
    ok = a.decide(req(1, P1, S1))
    refused = a.decide(DecideRequest(id=2, prefix=P1, suffix=S2, choices=("A", "A")))
    assert ok.error is None and refused.error is not None and refused.refused
    g = GenerateRequest(prompt="Hello there", n_predict=12, keep_logits=True)
    after = a.generate(g)
    never = decider().generate(g)
    assert after.tokens == never.tokens and len(after.logits) == len(never.logits) > 0
    assert all(np.array_equal(x, y) for x, y in zip(after.logits, never.logits, strict=True))
    assert a.decider.decider.store.kept is None  # generate() dropped the kept state
    assert a.decider.decider.seq.held_bytes == 0  # and freed its memory


def test_g18e_chat_continued_after_decisions_equals_one_that_never_saw_them(decider) -> None:
    """A decision between two chat turns (and a refused one) leaves the conversation as it was, and
    the continued turn (clear_kv false) computes what the decision left in the KV says: bit for bit
    what a fresh session holding the same conversation computes after the same decision (the same
    pieces: the decision's prompt, cut back to the tokens it shares with the chat, then the rest).

    A session that never saw the decision continues from its own first turn instead (it reuses more
    of the KV: other pieces), so there the promise is the same tokens up to a near-tie, chosen
    log-probs within CHUNKING_TOL (docs/testing.md "What a bit-exact test may compare"). On these
    Q8_0 models the rows came out identical on the AVX2 and the AVX-512 builds."""
    turns = [
        GenerateRequest(prompt="Hello there", n_predict=8, keep_logits=True),
        GenerateRequest(prompt="Tell me more", n_predict=8, keep_logits=True, clear_kv=False),
    ]
    a = decider()
    a.generate(turns[0])
    chat = list(a.history)
    assert a.decide(req(1, P1, S1)).error is None
    assert a.decide(DecideRequest(id=2, prefix=P1, suffix=S2, choices=("A", "A"))).refused
    assert a.history == chat
    after = a.generate(turns[1])

    same = decider()  # the same decision, then the same conversation: the same pieces
    assert same.decide(req(1, P1, S1)).error is None
    same.set_history(chat)
    again = same.generate(turns[1])
    assert (again.n_reused, again.n_prompt) == (after.n_reused, after.n_prompt)
    assert again.tokens == after.tokens and len(again.logits) == len(after.logits) > 0
    assert all(np.array_equal(x, y) for x, y in zip(after.logits, again.logits, strict=True))

    b = decider()
    b.generate(turns[0])
    never = b.generate(turns[1])
    assert b.history[: len(chat)] == chat and a.history[: len(chat) + 1] == b.history[: len(chat) + 1]
    assert after.n_reused + after.n_prompt == never.n_reused + never.n_prompt  # the same conversation
    assert_same_up_to_near_tie(after.tokens, after.logits, never.tokens, never.logits, tol=CHUNKING_TOL)


def test_g18e_dropping_the_kept_state_frees_its_copies(decider) -> None:
    a = decider()
    a.decide(req(1, P1, S1))
    a.decide(req(2, P2, S3, reuse_prefix=False))  # a copy exists now, on every arch
    assert a.decider.decider.seq.held_bytes >= a.decider.decider.store.kept.state.nbytes > 0
    a.generate(GenerateRequest(prompt="Hello", n_predict=2))
    assert a.decider.decider.store.kept is None and a.decider.decider.seq.held_bytes == 0


def test_g18f_session_without_decide_refuses_harmlessly(tiny_models, open_session) -> None:
    model = tiny_models("qwen35moe", "q8_0")
    s = open_session(model)
    first = s.generate(GenerateRequest(prompt="Hi", n_predict=6))
    kv, history = list(s.kv.tokens), list(s.history)
    with pytest.raises(RequestError, match=r"^decide is off in this session"):
        s.decide(req(1, P1, S1))
    assert s.decider is None and s.kv.tokens == kv and s.history == history
    cont = s.generate(GenerateRequest(prompt="More", n_predict=6, clear_kv=False))
    ref = open_session(model)
    ref.generate(GenerateRequest(prompt="Hi", n_predict=6))
    assert ref.generate(GenerateRequest(prompt="More", n_predict=6, clear_kv=False)).tokens == cont.tokens
    assert first.n_tokens > 0


def test_g18d_cache_hit_pct_is_over_the_decision_alone(decider) -> None:
    """As in BMOE_DONE: the expert cache's hits over its lookups during this request (its prefix
    piece and its rest summed), -1 with the cache off, absent for a resident model."""
    a = decider()
    a.decide(req(1, P1, S1))  # the session has looked experts up before the decisions measured
    for r in (req(2, P2, S3), req(3, P2, S3, reuse_prefix=False)):
        before = a.stream_stats()
        out = a.decide(r)
        own = a.stream_stats().minus(before)
        if a.streaming is None:
            assert out.cache_hit_pct is None
        elif not own.cache_on:
            assert out.cache_hit_pct == -1.0
        else:
            assert own.hits + own.misses > 0 and own.hits + own.misses < a.stream_stats().routed
            assert out.cache_hit_pct == 100.0 * own.hits / (own.hits + own.misses)


@pytest.mark.parametrize("arch", FULL_ARCHS)
def test_g18d_resident_equals_streaming(arch, tiny_models, open_session, tmp_path) -> None:
    model = tiny_models(arch, "q8_0")
    seq = [req(1, P1, S1), req(2, P1, S2), req(3, P2, S3), req(4, P2, S3, reuse_prefix=False)]
    answers = {}
    for mode, kw in modes_of(arch).items():
        s = open_session(model, decide=True, twin_dir=tmp_path / "twins", **kw)
        routes = record_routes(s) if kw.get("prefetch") else []
        results = s.decide_many(seq)
        answers[mode] = ([r.scores.choice_logp for r in results], [r.reuse for r in results], logits_of(s))
        if kw.get("prefetch"):  # prefill read-ahead ran, and every byte read is a routed slice or a wrong guess
            st, per_expert = s.stream_stats(), expert_bytes(s)
            if kw["cache_mb"] == 0:
                assert st.read_bytes == sum(per_expert[il] * len(ex) for il, ex in routes) + st.wasted_bytes
            else:  # each miss read once, whether on a guess or by its route
                (per,) = set(per_expert.values())
                assert st.read_bytes == per * st.misses + st.wasted_bytes
                assert st.hits + st.misses == st.routed == sum(len(ex) for _, ex in routes)
            if len(s.streaming.layout.layers) > 2:  # a prefill guesses all streamed layers but the first and last
                assert s.streaming.hook.n_wide_prefetches > 0 and st.guessed > 0
    ref = answers["resident"]
    assert ref[1] == ["stored", "restored", "restored+stored", "opted out"]
    for mode in set(answers) - {"resident"}:
        assert answers[mode][0] == ref[0] and answers[mode][1] == ref[1]
        assert np.array_equal(answers[mode][2], ref[2])
