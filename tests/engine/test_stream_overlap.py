"""The hook's split phase on the tiny fixtures: reads overlap the matmuls before their consumer,
no expert matmul is ever asked about while its projection is still being read, the first graph
stays synchronous, and output stays bit-identical to the plain run."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from bmoe.llama.expert_hook import ExpertHook
from bmoe.llama.ggml_tensor import SRC_OFFSET
from bmoe.stream import Streamer, StreamSettings, lookup, read_layout
from bmoe.stream.budget import Budget
from helpers.stream_e2e import plain, run


class CheckedHook(ExpertHook):
    """The real hook, observed from outside after each of its calls.

    An expert matmul is computed only after its own ask call, so when the hook has answered
    that ask its projection must not be pending any more; a violation is recorded, not raised
    (an exception here could not cross into C). ``bad_stops`` replaces every learned stop node
    with a name no node has, to exercise the fallback."""

    def __init__(self, *a, bad_stops: bool = False, **kw) -> None:  # noqa: ANN002, ANN003
        self.violations: list[tuple[int, str]] = []
        self.deferred_routes: list[bool] = []
        self.reading_routes: list[bool] = []
        self.bad_stops = bad_stops
        super().__init__(*a, **kw)

    def _callback(self, t, ask, user):  # noqa: ANN001, ANN202
        out = super()._callback(t, ask, user)
        if ask and t:
            key = self._weights.get(ctypes.c_void_p.from_address(t + SRC_OFFSET).value or 0)
            if key is not None and key[1] in self.streamer.pending:
                self.violations.append(key)
        return out

    def _route(self, t: int) -> None:
        super()._route(t)
        self.deferred_routes.append(bool(self.streamer.pending))
        self.reading_routes.append(bool(self.streamer._last.plan.misses))  # a route of cached experts reads nothing

    def _learn(self, il: int, proj: str, prev: int) -> None:
        super()._learn(il, proj, prev)
        if self.bad_stops and il in self._stop_of:
            self._stop_of[il] = (self._stop_of[il][0], b"no-such-node\0")


def _run(path: Path, budget: Budget, **hook_kw) -> tuple[list[int], np.ndarray, CheckedHook, Streamer]:  # noqa: ANN003
    layout = read_layout(path)
    streamer = Streamer(layout, StreamSettings(), budget=budget, warn=lambda m: None)
    hook = CheckedHook(streamer, lookup(layout.arch), **hook_kw)
    try:
        tokens, logits = run(path, hook)
    finally:
        streamer.close()
    return tokens, logits, hook, streamer


@pytest.mark.parametrize(
    "arch,quant,cache", [("qwen3moe", "q8_0", False), ("qwen35moe", "q4_k_m", False), ("qwen3moe", "q4_k_m", True)]
)
def test_down_reads_overlap_and_every_matmul_waits_for_its_bytes(
    tiny_models: Callable[[str, str], Path], arch: str, quant: str, cache: bool
) -> None:
    path = tiny_models(arch, quant)
    layout = read_layout(path)
    budget = Budget(layout.floor_bytes(), 0, "fixed") if cache else Budget(0, 0, "off")
    tokens, logits, hook, streamer = _run(path, budget)
    assert tokens == plain(path)[0] and np.array_equal(logits, plain(path)[1])
    assert hook.violations == []
    n_layers = len(layout.layers)
    # Learned from the graph: the down projection is consumed last, right after the node named here.
    assert {il: p for il, (p, _) in hook._stop_of.items()} == {il: "ffn_down_exps" for il in layout.layers}
    assert hook.deferred_routes[:n_layers] == [False] * n_layers  # the first graph is synchronous
    # then every route that reads defers down (a route of cached experts has nothing to defer)
    assert hook.deferred_routes[n_layers:] == hook.reading_routes[n_layers:]
    assert sum(hook.deferred_routes[n_layers:]) > len(layout.layers)
    assert cache or all(hook.reading_routes)
    assert hook.n_stop_waits == sum(hook.deferred_routes) and hook.n_late_waits == 0
    st = streamer.stats()
    assert st.n_routes == len(hook.deferred_routes) and st.hits + st.misses == st.routed
    assert 0 < st.stall_s <= st.io_s


def test_a_stop_node_that_never_comes_falls_back_to_waiting_at_the_matmul(
    tiny_models: Callable[[str, str], Path],
) -> None:
    path = tiny_models("qwen3moe", "f32")
    tokens, logits, hook, _ = _run(path, Budget(0, 0, "off"), bad_stops=True)
    assert tokens == plain(path)[0] and np.array_equal(logits, plain(path)[1])
    assert hook.violations == []
    assert hook.n_stop_waits == 0 and hook.n_late_waits == sum(hook.deferred_routes) > 0


def test_overlap_off_waits_for_everything_in_the_route(tiny_models: Callable[[str, str], Path]) -> None:
    path = tiny_models("qwen3moe", "q8_0")
    tokens, logits, hook, _ = _run(path, Budget(0, 0, "off"), overlap=False)
    assert tokens == plain(path)[0] and np.array_equal(logits, plain(path)[1])
    assert not any(hook.deferred_routes) and hook.n_stop_waits == hook.n_late_waits == 0
