"""G22: with --n-expert-used K, streamed output is byte-identical to the resident model with the same K.

The override changes what the model computes (tests/engine/test_n_expert_used.py shows it does),
not how streaming fetches it: resident, and streamed with the cache off, with an evicting cache and
with read-ahead, all loaded with the same K, give the same greedy tokens and the same float32 logit
rows. Every route the streamer sees is K experts wide, and with the cache off the bytes read are the
routed experts' slices exactly (G1's count). On the tiny qwen3moe (2 of 16 experts per token) below
and above its own K, and the hybrid qwen35moe (4 of 16) below it, in Q8_0, over a short generate.
"""

from __future__ import annotations

import numpy as np
import pytest

from bmoe.runtime.results import GenerateRequest

GEN = GenerateRequest(prompt="Tell me about the sea and the ships on it.", n_predict=12, keep_logits=True)
CASES = [("qwen3moe", 1), ("qwen3moe", 5), ("qwen35moe", 2)]


def record_routes(s) -> list[tuple[int, int, tuple[int, ...]]]:
    """Each route's (layer, experts per token, distinct experts), recorded as the streamer gets it."""
    streamer = s.streaming.streamer
    routes: list[tuple[int, int, tuple[int, ...]]] = []
    inner = streamer.on_route

    def on_route(il: int, ids: np.ndarray) -> None:
        routes.append((il, ids.shape[1], tuple(np.unique(ids).tolist())))
        inner(il, ids)

    streamer.on_route = on_route
    return routes


def assert_same(a, b) -> None:
    assert a.tokens == b.tokens and len(a.logits) == len(b.logits) > 0
    assert all(np.array_equal(x, y) for x, y in zip(a.logits, b.logits, strict=True))


@pytest.mark.parametrize(("arch", "k"), CASES, ids=[f"{a}-k{k}" for a, k in CASES])
def test_g22_resident_equals_streamed_with_the_same_k(tiny_models, open_session, tmp_path, arch: str, k: int) -> None:
    model = tiny_models(arch, "q8_0")
    twins = tmp_path / "twins"
    resident = open_session(model, n_ctx=256, n_expert_used=k)
    assert resident.model.n_expert_used == k != resident.model.n_expert_used_gguf
    reference = resident.generate(GEN)

    off = open_session(model, n_ctx=256, n_expert_used=k, moe_stream=True, twin_dir=twins)
    assert off.streaming.layout.n_expert_used == k
    routes = record_routes(off)
    assert_same(reference, off.generate(GEN))
    assert routes and all(width == k for _, width, _ in routes)
    per_expert = {il: off.streaming.layout.expert_nbytes_in_layer(il) for il in off.streaming.layout.layers}
    st = off.stream_stats()
    assert st.read_bytes == sum(per_expert[il] * len(ex) for il, _, ex in routes) and st.hits == 0

    # an evicting cache: 1 MiB holds five of a layer's experts, under one token's floor above K=1
    evicting = open_session(
        model, n_ctx=256, n_expert_used=k, moe_stream=True, twin_dir=twins, cache_mb=1, cache_force=True
    )
    routes = record_routes(evicting)
    assert_same(reference, evicting.generate(GEN))
    assert all(width == k for _, width, _ in routes)
    st = evicting.stream_stats()
    assert st.evictions > 0 and st.hits + st.misses == st.routed == sum(len(ex) for _, _, ex in routes)

    # read-ahead guesses half of K (rounded up) per token; what it reads changes no output
    ahead = open_session(model, n_ctx=256, n_expert_used=k, moe_stream=True, twin_dir=twins, prefetch=True)
    assert ahead.streaming.hook.guess.k == -(-k // 2)
    assert_same(reference, ahead.generate(GEN))
    assert ahead.stream_stats().guessed > 0
