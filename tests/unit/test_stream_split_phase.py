"""Split-phase routes: reads queued in the schedule's order, deferred projections pending until
waited for, the cache recording a route only once all of it is read, drains, sticky errors."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from bmoe.stream import Streamer, StreamSettings
from bmoe.stream.budget import Budget
from bmoe.stream.reader import StreamIOError
from helpers.stream import PROJS, make_layout
from helpers.stream_phases import HeldReads, present

DOWN, GATE, UP = PROJS
ORDER = (GATE, UP, DOWN)  # what qwen3moe's graph does: gate and up matmuls, then down


@pytest.mark.parametrize("cache", [False, True])
def test_deferred_projection_is_pending_until_waited_and_counted_then(tmp_path: Path, cache: bool) -> None:
    layout, data = make_layout(tmp_path)
    budget = Budget(layout.expert_nbytes, 0, "fixed") if cache else Budget(0, 0, "off")
    s = Streamer(layout, StreamSettings(io_threads=2), budget=budget)
    held = HeldReads(s, hold=DOWN)
    s.set_schedule(0, ORDER, {DOWN})
    s.on_route(0, np.array([[1, 6]]))  # returns although every down read is held
    assert s.pending == (DOWN,)
    assert present(s, data, 0, (1, 6), {GATE, UP})
    st = s.stats()
    assert st.routed == 0 and st.misses == 0 and st.n_routes == 0  # recorded once all of it is read
    held.release.set()
    s.wait(DOWN)
    assert s.pending == () and present(s, data, 0, (1, 6), {GATE, UP, DOWN})
    st = s.stats()
    assert st.routed == st.misses == 2 and st.n_routes == 1
    assert st.read_bytes == 2 * layout.expert_nbytes_in_layer(0)
    assert 0 < st.stall_s <= st.io_s
    s.close()


def test_reads_are_queued_in_the_schedules_order(tmp_path: Path) -> None:
    layout, _ = make_layout(tmp_path)
    s = Streamer(layout, StreamSettings(io_threads=1), budget=Budget(0, 0, "off"))
    held = HeldReads(s)
    s.on_route(0, np.array([[0, 5, 3]]))  # no schedule: all waited, the layout's order
    assert held.taken == [DOWN] * 3 + [GATE] * 3 + [UP] * 3 and s.pending == ()
    held.taken.clear()
    s.set_schedule(0, (UP, DOWN, GATE), {GATE})
    s.on_route(0, np.array([[0, 5, 3]]))
    s.drain()
    assert held.taken == [UP] * 3 + [DOWN] * 3 + [GATE] * 3  # one lane: strictly in queue order
    s.close()


def test_next_route_drains_the_previous_one_before_planning(tmp_path: Path) -> None:
    """With reads in flight nothing may be evicted, and a route's misses become hits only once
    read: the next route waits for the previous one first."""
    layout, data = make_layout(tmp_path)
    per = layout.expert_nbytes_in_layer(0)
    s = Streamer(layout, StreamSettings(io_threads=2), budget=Budget(2 * per, 0, "fixed"))
    for il in layout.layers:
        s.set_schedule(il, ORDER, {DOWN})
    s.on_route(0, np.array([[2, 3]]))
    assert s.pending == (DOWN,)
    s.on_route(0, np.array([[3, 4]]))  # 3 must count as a hit: the first route was drained and committed
    st = s.stats()
    assert (st.hits, s.pending) == (1, (DOWN,))
    s.on_route(1, np.array([[0, 1]]))  # evicts layer 0's experts, only after their reads are done
    s.drain()
    st = s.stats()
    assert st.hits + st.misses == st.routed == 6 and st.evictions == 3 and st.resident_bytes == 2 * per
    assert present(s, data, 1, (0, 1), set(PROJS))
    s.close()


def test_failed_deferred_read_raises_at_its_wait_and_is_sticky(tmp_path: Path) -> None:
    layout, data = make_layout(tmp_path)
    s = Streamer(layout, StreamSettings(io_threads=1), budget=Budget(0, 0, "off"))
    HeldReads(s, fail=DOWN)
    s.set_schedule(0, ORDER, {DOWN})
    s.on_route(0, np.array([[1, 2]]))  # one lane: gate and up are read before the down failure
    assert present(s, data, 0, (1, 2), {GATE, UP}) and s.error is None
    with pytest.raises(StreamIOError, match="injected failure reading ffn_down_exps"):
        s.wait(DOWN)
    assert s.pending == () and isinstance(s.error, StreamIOError)
    assert s.stats().routed == 0  # the route never completed
    with pytest.raises(StreamIOError, match="injected failure"):
        s.on_route(1, np.array([[0, 1]]))  # sticky
    s.close()


def test_close_with_a_route_in_flight_lets_no_read_outlive_the_buffers(tmp_path: Path) -> None:
    layout, _ = make_layout(tmp_path)
    s = Streamer(layout, StreamSettings(io_threads=2), budget=Budget(0, 0, "off"))
    held = HeldReads(s, hold=DOWN)
    s.set_schedule(0, ORDER, {DOWN})
    s.on_route(0, np.array([[0, 1, 2, 3]]))
    threading.Timer(0.2, held.release.set).start()
    s.close()  # waits for the held read in progress, skips what is still queued, then unmaps
    assert s.pending == ()


def test_schedule_must_fit_the_layer(tmp_path: Path) -> None:
    layout, _ = make_layout(tmp_path)
    s = Streamer(layout, StreamSettings(), budget=Budget(0, 0, "off"))
    with pytest.raises(ValueError, match="does not fit layer 0"):
        s.set_schedule(0, (GATE, UP), {UP})  # down missing
    with pytest.raises(ValueError, match="does not fit layer 0"):
        s.set_schedule(0, ORDER, {"ffn_other"})
    with pytest.raises(ValueError, match="does not fit layer 9"):
        s.set_schedule(9, ORDER, ())
    s.close()


def test_a_route_of_cached_experts_queues_nothing_and_is_recorded_at_once(tmp_path: Path) -> None:
    layout, _ = make_layout(tmp_path)
    s = Streamer(layout, StreamSettings(io_threads=2), budget=Budget(layout.expert_nbytes, 0, "fixed"))
    s.set_schedule(0, ORDER, {DOWN})
    s.on_route(0, np.array([[1, 6]]))
    s.drain()
    submitted: list[object] = []
    inner = s.reader.submit
    s.reader.submit = lambda *a, **kw: submitted.append(a) or inner(*a, **kw)  # type: ignore[method-assign]
    s.on_route(0, np.array([[6, 1]]))  # both cached: a deferred projection has nothing to wait for
    assert submitted == [] and s.pending == ()
    st = s.stats()
    assert (st.routed, st.hits, st.misses, st.n_routes) == (4, 2, 2, 2)
    assert st.read_bytes == 2 * layout.expert_nbytes_in_layer(0)
    s.on_route(0, np.array([[1, 3]]))  # one miss: read as before
    assert len(submitted) == 1
    s.drain()
    assert s.stats().n_routes == 3 and s.stats().misses == 3
    s.close()


@pytest.mark.parametrize("rows", [[[5, 2, 5]], [5, 2, 5], [[7]], [[3, 1], [1, 4], [3, 3]]])
def test_a_routes_union_counts_each_experts_tokens_and_last_row(rows: list) -> None:
    from bmoe.stream.streamer import _union

    experts, uses = _union(np.array(rows))
    grid = np.array(rows).reshape(-1, np.array(rows).shape[-1])
    assert experts.tolist() == sorted(set(grid.ravel().tolist()))
    assert uses.n_tokens == grid.shape[0]
    assert list(uses.counts) == [int((grid == e).sum()) for e in experts]
    assert list(uses.last) == [max(i for i, r in enumerate(grid) if e in r) for e in experts]
