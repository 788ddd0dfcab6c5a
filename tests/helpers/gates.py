"""The streaming gates' shared pieces: the variants, a reference run, bit-for-bit comparison, routes
and bytes read (tests/gates/test_streamed_equals_resident.py and the gates built on it)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from bmoe.runtime.results import GenerateRequest
from bmoe.testing import HF_ARCHS

_RESIDENT: dict[tuple[str, str], tuple] = {}  # one resident reference per variant, shared by the gates


HF_VARIANTS = [(a, q) for a in sorted(HF_ARCHS) for q in HF_ARCHS[a].quants]


VARIANTS = [(a, q) for a in ("qwen3moe", "qwen35moe") for q in ("f32", "q8_0", "q4_k_m")] + HF_VARIANTS


GEN = GenerateRequest(prompt="Tell me about the sea and the ships on it.", n_predict=64, keep_logits=True)


TEXT = (
    "The harbour was quiet at dawn. Fishing boats rocked against the pier while gulls circled "
    "overhead, waiting for the first catch of the day to be unloaded onto the stones."
)


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


def opener(variant: tuple[str, str], tiny_models, open_session, tmp_path) -> tuple[Callable, tuple]:
    model = tiny_models(*variant)

    def open_(**kw):
        if kw.get("moe_stream"):
            kw.setdefault("twin_dir", tmp_path / "twins")
        return open_session(model, n_ctx=256, **kw)

    if variant not in _RESIDENT:
        _RESIDENT[variant] = run(open_())
    return open_, _RESIDENT[variant]
