"""G1-G4: streamed output is byte-identical to resident output, and the counts are exact.

"==" is the same greedy tokens and the same float32 logit rows over a 64-token generate,
and the same logit rows over a perplexity run, on the tiny qwen3moe and hybrid qwen35moe in
F32, Q8_0 and Q4_K_M, and on every converted tiny model of a real architecture
(bmoe.testing.HF_ARCHS) in the quantizations its recipe names: G1 and G2 on all of them, G3 and G4 on
one per family (decide_prompts.FULL_GATES). The resident reference loads with the same model
parameters as the streamed runs (mmap, no repacked buffers), so both run the same kernels.
"""

from collections.abc import Callable

import pytest

from bmoe.stream.cache import ExpertCache, SlotCache, slots_refusal
from bmoe.testing import HF_ARCHS
from helpers.decide_prompts import FULL_ARCHS
from helpers.gates import VARIANTS, assert_same, check_warm_equals_cold, expert_bytes, opener, record_routes, run


@pytest.fixture(params=VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}")
def variant(request, tiny_models, open_session, tmp_path) -> tuple[Callable, tuple]:
    return opener(request.param, tiny_models, open_session, tmp_path)


# Reading all 16 experts of every layer is 8x the routed bytes: the K-quant files keep G3 and G4
# quick, and they are the files whose per-layer expert sizes differ (Q4_K and Q6_K). The converted
# models that run the whole gate set (one per family) run them on their first quantization; G1 and
# G2, the core gates, run on every variant.
G34_VARIANTS = [v for v in VARIANTS if v[1] == "q4_k_m"] + [
    (a, HF_ARCHS[a].quants[0]) for a in sorted(HF_ARCHS) if a in FULL_ARCHS
]


@pytest.fixture(params=G34_VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}")
def kquant_variant(request, tiny_models, open_session, tmp_path) -> tuple[Callable, tuple]:
    return opener(request.param, tiny_models, open_session, tmp_path)


def test_g1_resident_equals_streaming_cache_off_and_bytes_are_exact(variant) -> None:
    open_, resident = variant
    s = open_(moe_stream=True, cache_mb=0)
    routes = record_routes(s)
    streamed = run(s)
    assert_same(resident, streamed)
    per_expert = expert_bytes(s)
    st = s.stream_stats()
    assert st.read_bytes == sum(per_expert[il] * len(ex) for il, ex in routes)
    assert st.routed == sum(len(ex) for _, ex in routes) and st.hits == 0


@pytest.mark.parametrize("policy,memory", [("next-use", "slots"), ("lru", "slots"), ("next-use", "pages")])
def test_g2_evicting_cache_equals_cache_off(variant, policy: str, memory: str, monkeypatch) -> None:
    """The cache in slots (the default where the arch allows) and with page moves
    (BMOE_CACHE_SLOTS=0), under each policy."""
    open_, resident = variant
    if memory == "pages":
        monkeypatch.setenv("BMOE_CACHE_SLOTS", "0")
    s = open_(moe_stream=True, cache_mb=1, cache_force=True, cache_policy=policy)
    cache = s.streaming.streamer.cache
    assert type(cache.policy).__name__ == {"next-use": "NextUsePolicy", "lru": "LruPolicy"}[policy]
    slots = memory == "slots" and not slots_refusal(s.streaming.layout)
    assert isinstance(cache, SlotCache if slots else ExpertCache)
    routes = record_routes(s)
    streamed = run(s)
    assert_same(resident, streamed)
    st = s.stream_stats()
    assert st.evictions > 0
    if slots:  # victims' slots were handed to incoming experts, never more in use than there are
        assert cache.reused_bytes > 0 and 0 < cache.high_water <= cache.n_slots
    else:  # evicted experts' pages were handed to incoming ones (every tiny slice spans whole pages)
        assert cache.moved_bytes > 0
    assert st.hits + st.misses == st.routed == sum(len(ex) for _, ex in routes)
    # The budget is a hard cap except that one route's own experts must all be present at once.
    per_expert = expert_bytes(s)
    largest_route = max(per_expert[il] * len(ex) for il, ex in routes)
    assert st.budget_bytes == 1 << 20 and st.resident_bytes <= max(st.budget_bytes, largest_route)


def test_g3_reading_every_expert_equals_selective(kquant_variant) -> None:
    open_, resident = kquant_variant
    s = open_(moe_stream=True, stream_read_all=True)
    routes = record_routes(s)
    streamed = run(s)
    assert_same(resident, streamed)
    st = s.stream_stats()
    n_expert = s.streaming.layout.n_expert
    assert st.routed == len(routes) * n_expert


def test_g4_warm_generate_equals_cold_one_shot(kquant_variant) -> None:
    open_, resident = kquant_variant
    check_warm_equals_cold(open_(moe_stream=True, cache_mb=64), resident)
