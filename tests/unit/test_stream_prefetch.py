"""Speculative prefetch: the guess, and how a route takes over the reads of a guess (all right,
partly right, all wrong), with exact counts, urgent reads for what the guess missed, and sticky
errors for a prefetch read that fails."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from bmoe.stream import ExpertKey, Streamer, StreamSettings, lookup, read_layout
from bmoe.stream.archs import _entry
from bmoe.stream.budget import Budget
from bmoe.stream.prefetch import WIDE_COVER, PrefetchError, RouterGuess, wide_cut
from bmoe.stream.reader import StreamIOError
from helpers.stream import PROJS, make_layout
from helpers.stream_phases import HeldReads, present

DOWN, GATE, UP = PROJS
ORDER = (GATE, UP, DOWN)


def _off(layout, io_threads: int = 2) -> Streamer:  # noqa: ANN001
    s = Streamer(layout, StreamSettings(io_threads=io_threads), budget=Budget(0, 0, "off"))
    for il in layout.layers:
        s.set_schedule(il, ORDER, {DOWN})
    return s


# --- the guess ---------------------------------------------------------------------------------
def test_guess_is_the_top_k_of_the_router_on_the_rms_normed_input() -> None:
    rng = np.random.default_rng(3)
    n_expert, n_embd, k = 32, 48, 4
    router = rng.standard_normal((n_expert, n_embd)).astype(np.float32)
    norm = rng.uniform(0.5, 2.0, n_embd).astype(np.float32)
    g = RouterGuess({5: router * norm[None, :]}, n_embd, k, wide=1000)
    for _ in range(50):
        h = (rng.standard_normal(n_embd) * rng.uniform(0.1, 30)).astype(np.float32)
        x = h / np.sqrt(np.mean(h * h) + 1e-6) * norm  # what llama.cpp's ffn_norm feeds the router
        logits = router @ x
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        assert g.guess(5, h).tolist() == sorted(np.argsort(-probs)[:k].tolist())
    assert g.can_guess(5) and not g.can_guess(4)


def test_a_ubatch_guesses_the_union_of_its_tokens_and_every_expert_once_wide() -> None:
    rng = np.random.default_rng(4)
    n_expert, n_embd, k = 32, 16, 2
    g = RouterGuess({1: rng.standard_normal((n_expert, n_embd)).astype(np.float32)}, n_embd, k, wide=6)
    h = rng.standard_normal((5, n_embd)).astype(np.float32)
    union = g.guess(1, h)
    assert union.tolist() == sorted(set().union(*(g.guess(1, row).tolist() for row in h)))
    assert k < union.size < n_expert and g.guess(1, h[:1]).tolist() == g.guess(1, h[0]).tolist()
    # strided rows (how the hook sees a ubatch's l_out) guess the same as contiguous ones
    padded = np.zeros((5, n_embd + 3), dtype=np.float32)
    padded[:, :n_embd] = h
    assert g.guess(1, padded[:, :n_embd]).tolist() == union.tolist()
    wide = rng.standard_normal((6, n_embd)).astype(np.float32)
    assert g.guess(1, wide).tolist() == list(range(n_expert))


def test_the_default_wide_cut_leaves_about_five_percent_unpicked_under_uniform_routing() -> None:
    assert WIDE_COVER == 3.0 and wide_cut(16, 2) == 24 and wide_cut(128, 8) == 48 and wide_cut(4, 4) == 3
    n, used, t = 128, 8, wide_cut(128, 8)
    assert abs((1 - used / n) ** t - np.exp(-WIDE_COVER)) < 0.01  # the share a uniform ubatch leaves out


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])
def test_guess_weights_are_the_gguf_router_times_its_norm(tiny_models, arch: str) -> None:
    path = tiny_models(arch, "q4_k_m")
    layout = read_layout(path)
    g = RouterGuess.load(layout, lookup(arch))
    norm_name = lookup(arch).router_norm
    r = gguf.GGUFReader(path)
    t = {x.name: np.asarray(x.data, dtype=np.float32) for x in r.tensors}
    assert sorted(g.weights) == list(layout.layers) and g.k == -(-layout.n_expert_used // 2)  # GUESS_SHARE
    assert RouterGuess.load(layout, lookup(arch), k=3).k == 3
    assert g.wide == wide_cut(layout.n_expert, layout.n_expert_used)
    assert RouterGuess.load(layout, lookup(arch), wide=7).wide == 7
    for il in layout.layers:
        want = t[f"blk.{il}.ffn_gate_inp.weight"].reshape(layout.n_expert, -1) * t[f"blk.{il}.{norm_name}"][None, :]
        assert np.array_equal(g.weights[il], want)


def test_an_arch_without_a_router_entry_is_refused_with_its_reason(tiny_models) -> None:
    layout = read_layout(tiny_models("qwen3moe", "q8_0"))
    entry = _entry("qwen3moe", "router", why_no_prefetch="its routing adds a bias the guess leaves out")
    with pytest.raises(
        PrefetchError,
        match="cannot guess the routing of architecture 'qwen3moe': its routing adds a bias the guess leaves out",
    ):
        RouterGuess.load(layout, entry)


def test_a_norm_that_is_not_a_vector_is_refused_as_a_prefetch_error(tiny_models, monkeypatch) -> None:
    # A damaged file whose router norm has no dimension (or several): a PrefetchError naming the
    # layer, never an IndexError from reading its width first.
    import bmoe.stream.prefetch as prefetch_mod

    layout = read_layout(tiny_models("qwen3moe", "q8_0"))
    real = prefetch_mod._as_f32

    def scalar_norm(path, t):  # noqa: ANN001
        x = real(path, t)
        return np.float32(1.0).reshape(()) if t.name.endswith(lookup("qwen3moe").router_norm) else x

    monkeypatch.setattr(prefetch_mod, "_as_f32", scalar_norm)
    with pytest.raises(PrefetchError, match=r"blk\.0: router \[\d+, \d+\] and norm \[\] do not fit"):
        RouterGuess.load(layout, lookup("qwen3moe"))


# --- a route taking a prefetch over --------------------------------------------------------------
@pytest.mark.parametrize(
    "guess, routed",
    [
        ((1, 4), (1, 4)),  # all right: the route reads nothing new
        ((1, 4), (4, 6)),  # partly right
        ((0, 2), (4, 6)),  # all wrong
    ],
)
def test_route_takes_the_guess_over_and_reads_only_what_it_missed(tmp_path: Path, guess, routed) -> None:
    layout, data = make_layout(tmp_path)
    per = layout.expert_nbytes_in_layer(1)
    s = _off(layout, io_threads=1)
    held = HeldReads(s)
    s.prefetch(1, np.array(guess))
    assert s.prefetching == 1
    s.on_route(1, np.array([routed]))
    s.drain()
    assert s.prefetching is None and s.pending == ()
    assert present(s, data, 1, routed, set(PROJS))
    fresh = set(routed) - set(guess)
    hits, wrong = len(set(routed) & set(guess)), len(set(guess) - set(routed))
    st = s.stats()
    assert (st.guessed, st.guess_hits, st.wasted_bytes) == (2, hits, wrong * per)
    assert st.read_bytes == len(routed) * per + st.wasted_bytes  # routed slices + wrong guesses
    assert st.routed == st.misses == 2 and st.n_routes == 1
    # One read per (expert, projection): the experts are not adjacent, so nothing was merged.
    assert len(held.taken) == 3 * (len(guess) + len(fresh))
    s.close()


def test_missed_experts_go_ahead_of_the_guessed_reads_still_queued(tmp_path: Path) -> None:
    layout, _ = make_layout(tmp_path)
    s = _off(layout, io_threads=1)
    held = HeldReads(s, hold=GATE)  # the lane holds the first guessed read: the rest stays queued
    s.prefetch(2, np.array([0, 3]))
    import threading

    threading.Timer(0.2, held.release.set).start()
    s.on_route(2, np.array([[3, 6]]))  # 6 was missed: its gate and up pass the queued guess
    s.drain()
    # gate(0) was being read; then the miss's gate and up; then the guess's rest in its order;
    # the miss's down (deferred, not urgent) comes last.
    assert held.taken == [GATE, GATE, UP, GATE, UP, UP, DOWN, DOWN, DOWN]
    s.close()


def test_a_guess_for_another_layer_is_finished_and_wasted(tmp_path: Path) -> None:
    layout, data = make_layout(tmp_path)
    s = _off(layout)
    s.prefetch(3, np.array([1, 2]))
    s.on_route(0, np.array([[1, 2]]))  # not the guessed layer: the guess is read for nothing
    s.drain()
    st = s.stats()
    assert st.guess_hits == 0 and st.wasted_bytes == 2 * layout.expert_nbytes_in_layer(3)
    assert st.read_bytes == 2 * layout.expert_nbytes_in_layer(0) + st.wasted_bytes
    assert present(s, data, 0, (1, 2), set(PROJS))
    s.prefetch(1, np.array([5]))
    s.drain()  # never taken over (what raise_if_failed does after llama_decode)
    assert s.prefetching is None and s.stats().wasted_bytes == st.wasted_bytes + layout.expert_nbytes_in_layer(1)
    s.close()


def test_prefetch_refuses_ids_outside_the_layer_with_the_cache_off_or_on(tmp_path: Path) -> None:
    layout, _ = make_layout(tmp_path)
    for s in (
        _off(layout),
        Streamer(layout, StreamSettings(cache_mb=1), budget=Budget(layout.expert_nbytes, 0, "fixed")),
    ):
        with pytest.raises(ValueError, match="cannot prefetch"):
            s.prefetch(0, np.array([layout.n_expert]))
        with pytest.raises(ValueError, match="cannot prefetch"):
            s.prefetch(99, np.array([1]))
        assert s.prefetching is None and s.stats().guessed == 0  # nothing was queued or reserved
        s.close()


@pytest.mark.parametrize("taken_over", [True, False])
def test_a_failed_prefetch_read_is_the_sticky_error(tmp_path: Path, taken_over: bool) -> None:
    layout, _ = make_layout(tmp_path)
    s = _off(layout, io_threads=1)
    held = HeldReads(s, fail=UP)
    s.prefetch(1, np.array([2, 5]))
    with pytest.raises(StreamIOError, match="injected failure reading ffn_up_exps"):
        if taken_over:
            s.on_route(1, np.array([[5, 7]]))  # the guess's up failed: the route's up wait raises
        else:
            s.drain()
    assert s.pending == () and s.prefetching is None and isinstance(s.error, StreamIOError)
    assert s.stats().routed == 0
    held.fail = None
    with pytest.raises(StreamIOError, match="injected failure"):  # sticky
        s.prefetch(2, np.array([1]))
    with pytest.raises(StreamIOError, match="injected failure"):
        s.on_route(2, np.array([[1]]))
    s.close()


# --- read-ahead two layers deep -------------------------------------------------------------------
def test_two_buffer_sets_give_consecutive_layers_buffers_of_their_own(tmp_path: Path) -> None:
    layout, _ = make_layout(tmp_path)
    one = Streamer(layout, StreamSettings(), budget=Budget(0, 0, "off"))
    two = Streamer(layout, StreamSettings(), budget=Budget(0, 0, "off"), buffer_sets=2)
    addr = {s: {t.il: s.cache._buffer(t).window.addr for t in layout.experts if t.proj == GATE} for s in (one, two)}
    assert len(set(addr[one].values())) == 1 and not one.two_deep
    assert addr[two][0] == addr[two][2] != addr[two][1] == addr[two][3] and two.two_deep
    with pytest.raises(ValueError, match="early guess for layer 1 needs"):
        one.on_route(0, np.array([[1, 2]]))
        one.prefetch(1, np.array([3]), early=True)  # the shared buffers would be overwritten
    for s in (one, two):
        s.close()


@pytest.mark.parametrize("cache", [False, True])
def test_an_early_guess_reads_behind_the_route_without_waiting_for_it(tmp_path: Path, cache: bool) -> None:
    """At layer 0's route, layer 1 is guessed early: its reads queue behind the route's, whose
    deferred down is still held, and land in layer 1's own buffers; a second guess adds only what
    the first left out; layer 1's route takes both over. Everything arrives, every byte counted."""
    layout, data = make_layout(tmp_path)
    per = layout.expert_nbytes_in_layer(1)
    budget = Budget(layout.expert_nbytes, 0, "fixed") if cache else Budget(0, 0, "off")
    s = Streamer(layout, StreamSettings(io_threads=1), budget=budget, buffer_sets=2)
    for il in layout.layers:
        s.set_schedule(il, ORDER, {DOWN})
    held = HeldReads(s, hold=DOWN)
    s.on_route(0, np.array([[1, 6]]))
    s.prefetch(1, np.array([2, 3]), early=True)  # returns at once although layer 0's down is held
    assert s.pending == (DOWN,) and s.prefetching == 1
    assert held.taken == [GATE, GATE, UP, UP, DOWN]  # the lane holds layer 0's first down read
    held.release.set()
    s.wait(DOWN)
    assert present(s, data, 0, (1, 6), set(PROJS))
    s.prefetch(1, np.array([3, 5]))  # at l_out-0: only 5 is new
    s.on_route(1, np.array([[3, 5], [5, 7]]))
    s.drain()
    assert present(s, data, 1, (3, 5, 7), set(PROJS)) and present(s, data, 0, (1, 6), set(PROJS))
    st = s.stats()
    assert (st.guessed, st.guess_hits, st.wasted_bytes) == (3, 2, per)  # 2 was wrong
    assert st.read_bytes == 2 * layout.expert_nbytes_in_layer(0) + 3 * per + st.wasted_bytes
    assert st.routed == 5 and st.n_routes == 2
    s.close()


def test_an_early_guess_evicts_nothing_of_the_route_whose_matmuls_are_still_to_run(tmp_path: Path) -> None:
    """Cache on, budget of two experts: layer 0's route is recorded at once (its misses count
    against the budget), and the early guess for layer 1 makes room from anything but that
    route's experts, which stay in place, byte for byte, even once all of layer 0's reads are done
    (the route is waited, its matmuls have not run yet)."""
    layout, data = make_layout(tmp_path)
    two = 2 * layout.expert_nbytes_in_layer(0)
    s = Streamer(layout, StreamSettings(cache_mb=1), budget=Budget(two, 0, "fixed"))
    assert s.two_deep
    s.on_route(2, np.array([[4]]))
    s.on_route(3, np.array([[5]]))  # resident: (2, 4), (3, 5)
    s.drain()
    s.on_route(0, np.array([[1, 6]]))  # evicts both, waits every read (no schedule: nothing deferred)
    assert s.pending == ()
    s.prefetch(1, np.array([2]), early=True)
    assert s.cache.is_resident(ExpertKey(0, 1)) and s.cache.is_resident(ExpertKey(0, 6))
    assert s.cache.is_resident(ExpertKey(1, 2))  # over budget by the guess: nothing else was free
    s.drain()
    assert present(s, data, 0, (1, 6), set(PROJS)) and present(s, data, 1, (2,), set(PROJS))
    st = s.stats()
    assert st.resident_bytes == 3 * layout.expert_nbytes_in_layer(0) and st.misses == 4
    s.prefetch(2, np.array([0]))  # not early: layer 1's route is over, so anything may go
    s.drain()
    assert s.stats().resident_bytes <= two
    s.close()
