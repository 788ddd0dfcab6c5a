"""G23: the streaming and decide gates on the weight types real GGUFs ship their experts in.

Real downloads are K-quants (Q4_K_M, Q6_K), i-quants (IQ4_XS) or MXFP4 (gpt-oss). K-quant and IQ4_XS
blocks are 256 values wide, and llama.cpp's quantizer gives a row that is not a whole number of them
another type (the 64-wide converted recipes' "Q4_K_M" experts are Q5_0/Q8_0). So these run on files
whose expert rows are 256 wide: the hand-written qwen3moe and qwen35moe (already 256 wide) and the
256-wide converted recipes of bmoe.testing.HF_KQUANT_ARCHS, each quantized by llama.cpp's quantizer.

- G23a: every expert tensor bmoe streams holds the type its file is named for (Q4_K_M: Q4_K for
  gate/up, Q4_K or Q6_K for down, both present; Q6_K: Q6_K; IQ4_XS: IQ4_XS; MXFP4_MOE: MXFP4), so
  the gates below cannot pass on a fallback type.
- G23b: G1-G4 on each file (the hand-written Q4_K_M ones already run them in
  test_streamed_equals_resident.py): resident == streamed bit for bit with the cache off (bytes read are the
  routed slices exactly), with an evicting cache in slots and with page moves (IQ4_XS, MXFP4 and
  Q6_K slices end inside a page), reading every expert, and a warm second run reading nothing.
- G23c: the decide gates G18a and G18d on each file: a restored prefix equals a fresh session's
  computing the same pieces, and a sequence of stored / restored / grown / opted-out decisions
  answers bit for bit the same resident and streamed (cache off, evicting, and with read-ahead where
  the architecture allows it), with the bytes read accounted for.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from bmoe.decide.types import DecideRequest
from bmoe.runtime.results import GenerateRequest
from bmoe.stream.cache import ExpertCache, SlotCache, slots_refusal
from bmoe.stream.layout import read_header, read_layout
from bmoe.testing import HF_KQUANT_ARCHS, hf_arch
from helpers.decide_prompts import ABC, MODES, P1, P2, S1, S2, S3, modes_of
from helpers.gates import TEXT, assert_same, check_warm_equals_cold, expert_bytes, record_routes

T = gguf.GGMLQuantizationType
# The hand-written models in the quantizer's variants, then every 256-wide converted recipe in its own.
KQ_VARIANTS = [(a, q) for a in ("qwen3moe", "qwen35moe") for q in ("q4_k_m", "q6_k", "iq4_xs")] + [
    (name, q) for name in sorted(HF_KQUANT_ARCHS) for q in HF_KQUANT_ARCHS[name].quants
]
# What each variant's expert tensors must be: per projection kind (gate, up or fused gate_up; down).
EXPERT_TYPES = {
    "q4_k_m": ({T.Q4_K}, {T.Q4_K, T.Q6_K}),  # llama.cpp gives some layers' down projection more bits
    "q6_k": ({T.Q6_K}, {T.Q6_K}),
    "iq4_xs": ({T.IQ4_XS}, {T.IQ4_XS}),
    "mxfp4_moe": ({T.MXFP4}, {T.MXFP4}),
}
IDS = [f"{a}-{q}" for a, q in KQ_VARIANTS]
# G1-G4 already run the hand-written Q4_K_M files (test_streamed_equals_resident.py): G23b takes the rest.
STREAM_VARIANTS = [v for v in KQ_VARIANTS if v not in (("qwen3moe", "q4_k_m"), ("qwen35moe", "q4_k_m"))]
# G1's generate, half as long (14 files x 5 gates here); G1's perplexity run (37 tokens, windows of 32).
GEN = GenerateRequest(prompt="Tell me about the sea and the ships on it.", n_predict=32, keep_logits=True)


def gguf_arch(name: str) -> str:
    """general.architecture of the recipe ``name`` (the registry, and so modes_of, key on it)."""
    return name if name in ("qwen3moe", "qwen35moe") else hf_arch(name).arch


def run(s):
    return s.generate(GEN), s.perplexity(TEXT, n_window=32, keep_logits=True)


_RESIDENT: dict[tuple[str, str], tuple] = {}  # one resident reference per variant, shared by the gates


@pytest.fixture(params=STREAM_VARIANTS, ids=[f"{a}-{q}" for a, q in STREAM_VARIANTS])
def kq_variant(request, tiny_models, open_session, tmp_path):
    model = tiny_models(*request.param)

    def open_(**kw):
        if kw.get("moe_stream"):
            kw.setdefault("twin_dir", tmp_path / "twins")
        return open_session(model, n_ctx=256, **kw)

    if request.param not in _RESIDENT:
        _RESIDENT[request.param] = run(open_())
    return open_, _RESIDENT[request.param]


@pytest.mark.parametrize("variant", KQ_VARIANTS, ids=IDS)
def test_g23a_streamed_experts_hold_the_named_types(tiny_models, variant) -> None:
    name, quant = variant
    path = tiny_models(name, quant)
    layout, header = read_layout(path), read_header(path)
    types = {t.name: T(t.ggml_type) for t in header.tensors}
    rows = {t.name: t.ne[0] for t in header.tensors}
    up, down = EXPERT_TYPES[quant]
    seen = set()
    # the layout streams every expert matrix of the file (none stays resident unchecked)
    assert {t.name for t in layout.experts} == {n for n in types if n.endswith("_exps.weight")}
    for t in layout.experts:
        want = down if t.proj == "ffn_down_exps" else up
        assert types[t.name] in want, f"{t.name} is {types[t.name].name}, not {sorted(w.name for w in want)}"
        assert rows[t.name] % 256 == 0  # whole 256-value super-blocks: no fallback was needed
        seen.add(types[t.name])
    assert seen == up | down  # Q4_K_M: both the Q4_K and the Q6_K down projections are there


def test_g23b_g1_resident_equals_streamed_cache_off_bytes_exact(kq_variant) -> None:
    open_, resident = kq_variant
    s = open_(moe_stream=True, cache_mb=0)
    routes = record_routes(s)
    assert_same(resident, run(s))
    per_expert = expert_bytes(s)
    st = s.stream_stats()
    assert st.read_bytes == sum(per_expert[il] * len(ex) for il, ex in routes)
    assert st.routed == sum(len(ex) for _, ex in routes) and st.hits == 0


@pytest.mark.parametrize("memory", ["slots", "pages"])
def test_g23b_g2_evicting_cache_equals_resident(kq_variant, memory: str, monkeypatch) -> None:
    open_, resident = kq_variant
    if memory == "pages":
        monkeypatch.setenv("BMOE_CACHE_SLOTS", "0")
    s = open_(moe_stream=True, cache_mb=1, cache_force=True)
    cache = s.streaming.streamer.cache
    slots = memory == "slots" and not slots_refusal(s.streaming.layout)  # gpt-oss, gemma4: pages
    assert isinstance(cache, SlotCache if slots else ExpertCache)
    routes = record_routes(s)
    assert_same(resident, run(s))
    st = s.stream_stats()
    assert st.evictions > 0 and st.hits + st.misses == st.routed == sum(len(ex) for _, ex in routes)
    if slots:  # victims' slots went to incoming experts (a slice of partial pages through the bounce buffer)
        assert cache.reused_bytes > 0 and 0 < cache.high_water <= cache.n_slots
    else:  # the whole pages inside a victim's slice went to the incoming one
        assert cache.moved_bytes > 0
    per_expert = expert_bytes(s)
    assert st.resident_bytes <= max(st.budget_bytes, max(per_expert[il] * len(ex) for il, ex in routes))


def test_g23b_g3_reading_every_expert_equals_resident(kq_variant) -> None:
    open_, resident = kq_variant
    s = open_(moe_stream=True, stream_read_all=True)
    routes = record_routes(s)
    assert_same(resident, run(s))
    assert s.stream_stats().routed == len(routes) * s.streaming.layout.n_expert


def test_g23b_g4_warm_run_equals_cold_and_reads_nothing(kq_variant) -> None:
    open_, resident = kq_variant
    check_warm_equals_cold(open_(moe_stream=True, cache_mb=64), resident, run)


def req(i: int, prefix: str, suffix: str, **kw: object) -> DecideRequest:
    return DecideRequest(id=i, prefix=prefix, suffix=suffix, choices=ABC, **kw)


@pytest.mark.parametrize("variant", KQ_VARIANTS, ids=IDS)
def test_g23c_decisions_streamed_equal_resident_and_restore_exactly(tiny_models, open_session, tmp_path, variant):
    """G18d: stored, restored, grown (restored+stored) and opted-out decisions answer bit for bit the
    same resident and streamed in every mode, the bytes read accounted for. G18a: the restored one
    equals a fresh streamed session's computing the same prefix and suffix (the same two pieces).

    One decide() at a time, not decide_many: a list batches the decisions that share a prefix, and
    a batch is cut into other ubatches streamed (suffixes padded into one) than resident (as they
    are). A K-quant row rounds differently on either side of the tiled matmul's 8 rows
    (docs/decide.md, "What is exact"); G19 checks batches against one by one on these files."""
    model = tiny_models(*variant)
    seq = [req(1, P1, S1), req(2, P1, S2), req(3, P2, S3), req(4, P2, S3, reuse_prefix=False)]
    twins = tmp_path / "twins"
    answers = {}
    for mode, kw in modes_of(gguf_arch(variant[0])).items():
        s = open_session(model, decide=True, twin_dir=twins, **kw)
        routes = record_routes(s) if kw.get("moe_stream") else []
        answers[mode] = []
        for r in seq:
            out = s.decide(r)
            logits = s.decider.decider.seq.last_logits().copy()
            answers[mode].append((out.scores.choice_logp, out.reuse, out.n_reused, logits))
        if not kw.get("moe_stream"):
            continue
        st, per_expert = s.stream_stats(), expert_bytes(s)
        assert st.hits + st.misses == st.routed == sum(len(ex) for _, ex in routes)
        if kw["cache_mb"] == 0:  # every routed slice read once per route, plus the wrong guesses
            assert st.read_bytes == sum(per_expert[il] * len(ex) for il, ex in routes) + st.wasted_bytes
        else:  # each miss read once, on a guess or by its route; Q4_K_M's layers differ in size
            lo, hi = min(per_expert.values()), max(per_expert.values())
            assert lo * st.misses <= st.read_bytes - st.wasted_bytes <= hi * st.misses and st.evictions > 0
    ref = answers["resident"]
    assert [a[1] for a in ref] == ["stored", "restored", "restored+stored", "opted out"]
    for mode in set(answers) - {"resident"}:
        for i, (got, want) in enumerate(zip(answers[mode], ref, strict=True)):
            assert got[:3] == want[:3] and np.array_equal(got[3], want[3]), f"{mode}: decision {i + 1}"

    fresh = open_session(model, decide=True, twin_dir=twins, **MODES["stream-evicting"])
    alone = fresh.decide(req(2, P1, S2))
    logp, reuse, n_reused, logits = answers["stream-evicting"][1]
    assert (reuse, alone.reuse) == ("restored", "stored") and n_reused > 0 == alone.n_reused
    assert logp == alone.scores.choice_logp and np.array_equal(logits, fresh.decider.decider.seq.last_logits())
