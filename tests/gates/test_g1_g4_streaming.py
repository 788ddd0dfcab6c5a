"""G1-G4: streamed output is byte-identical to resident output, and the counts are exact.

"==" is the same greedy tokens and the same float32 logit rows over a 64-token generate,
and the same logit rows over a perplexity run, on the tiny qwen3moe and hybrid qwen35moe in
F32, Q8_0 and Q4_K_M, and on every converted tiny model of a real architecture
(bmoe.testing.HF_ARCHS) in the quantizations its recipe names: G1 and G2 on all of them, G3 and G4 on
one per family (decide_prompts.FULL_GATES). The resident reference loads with the same model
parameters as the streamed runs (mmap, no repacked buffers), so both run the same kernels.
"""
from collections.abc import Callable

import numpy as np
import pytest

from bmoe.runtime.results import GenerateRequest
from bmoe.stream.cache import ExpertCache, SlotCache, slots_refusal
from bmoe.testing import HF_ARCHS
from helpers.decide_prompts import FULL_ARCHS

HF_VARIANTS = [(a, q) for a in sorted(HF_ARCHS) for q in HF_ARCHS[a].quants]
VARIANTS = [(a, q) for a in ("qwen3moe", "qwen35moe") for q in ("f32", "q8_0", "q4_k_m")] + HF_VARIANTS
GEN = GenerateRequest(prompt="Tell me about the sea and the ships on it.", n_predict=64, keep_logits=True)
TEXT = ("The harbour was quiet at dawn. Fishing boats rocked against the pier while gulls circled "
        "overhead, waiting for the first catch of the day to be unloaded onto the stones.")


def run(s):
    g = s.generate(GEN)
    p = s.perplexity(TEXT, n_window=32, keep_logits=True)
    return g, p


def assert_same(a, b) -> None:
    (ga, pa), (gb, pb) = a, b
    assert ga.tokens == gb.tokens and len(ga.logits) == len(gb.logits) > 0
    assert all(np.array_equal(x, y) for x, y in zip(ga.logits, gb.logits, strict=True))
    assert np.array_equal(pa.logits, pb.logits) and pa.ppl == pb.ppl


def check_warm_equals_cold(s, resident, run=run) -> None:
    """G4 on a session whose cache holds every expert: a cold ``run`` equals ``resident``, and a
    second one equals the first and reads nothing (every route is a hit)."""
    cold = run(s)
    before = s.stream_stats()
    warm = run(s)
    after = s.stream_stats()
    assert_same(resident, cold)
    assert_same(cold, warm)
    assert after.hits - before.hits == after.routed - before.routed  # everything was cached
    assert after.read_bytes == before.read_bytes


def record_routes(s) -> list[tuple[int, tuple[int, ...]]]:
    """Wrap the session's streamer so each route's (layer, distinct experts) is recorded."""
    streamer = s.streaming.streamer
    routes: list[tuple[int, tuple[int, ...]]] = []
    inner = streamer.on_route

    def on_route(il: int, ids: np.ndarray) -> None:
        routes.append((il, tuple(np.unique(ids).tolist())))
        inner(il, ids)

    streamer.on_route = on_route
    return routes


def expert_bytes(s) -> dict[int, int]:
    """Bytes of one expert (all projections) per layer, from the GGUF layout."""
    out: dict[int, int] = {}
    for t in s.streaming.layout.experts:
        out[t.il] = out.get(t.il, 0) + t.nbytes // t.n_expert
    return out


_RESIDENT: dict[tuple[str, str], tuple] = {}  # one resident reference per variant, shared by the gates


def opener(variant: tuple[str, str], tiny_models, open_session, tmp_path) -> tuple[Callable, tuple]:
    model = tiny_models(*variant)

    def open_(**kw):
        if kw.get("moe_stream"):
            kw.setdefault("twin_dir", tmp_path / "twins")
        return open_session(model, n_ctx=256, **kw)

    if variant not in _RESIDENT:
        _RESIDENT[variant] = run(open_())
    return open_, _RESIDENT[variant]


@pytest.fixture(params=VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}")
def variant(request, tiny_models, open_session, tmp_path) -> tuple[Callable, tuple]:
    return opener(request.param, tiny_models, open_session, tmp_path)


# Reading all 16 experts of every layer is 8x the routed bytes: the K-quant files keep G3 and G4
# quick, and they are the files whose per-layer expert sizes differ (Q4_K and Q6_K). The converted
# models that run the whole gate set (one per family) run them on their first quantization; G1 and
# G2, the core gates, run on every variant.
G34_VARIANTS = [v for v in VARIANTS if v[1] == "q4_k_m"] + [
    (a, HF_ARCHS[a].quants[0]) for a in sorted(HF_ARCHS) if a in FULL_ARCHS]


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
