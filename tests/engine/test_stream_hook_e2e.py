"""End to end on the tiny random MoE fixtures (bmoe.testing): streamed == resident, bit for bit.

Every arch/quant of the fixtures: the cache off, and a cache that evicts on every token, must give
the same greedy tokens and the same logits as the plain mmap run with the same load parameters
(mmap, no repacked buffers), so both run the same kernels. Counts are exact: bytes read with the
cache off equal the routed experts' slice bytes; with the cache, hits + misses = routed.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import llama_cpp  # noqa: E402
import numpy as np
import pytest

from bmoe.llama.expert_hook import ExpertHook, HookError  # noqa: E402
from bmoe.stream import Streamer, StreamSettings, lookup, read_layout  # noqa: E402
from bmoe.stream.budget import Budget  # noqa: E402
from bmoe.stream.cache import SlotCache  # noqa: E402
from bmoe.stream.policy import (
    DEFAULT_POLICY,  # noqa: E402
    Uses,  # noqa: E402
)
from bmoe.stream.twin import allocated_bytes, dense_twin  # noqa: E402
from helpers.stream_e2e import N_GEN, PROMPT, Recorder, plain, run  # noqa: E402

MODELS = [(a, q) for a in ("qwen3moe", "qwen35moe") for q in ("f32", "q8_0", "q4_k_m")]


def reference_counts(layout, budget: int, rec: Recorder) -> tuple[int, int, int, int]:
    """(hits, misses, evictions, bytes read) of the cache's policy replayed on the recorded routes
    without buffers or reads: the streamer must count exactly what its policy decides. The token
    counts and last rows are worked out here, not with the streamer's helper."""
    policy = DEFAULT_POLICY({il: layout.expert_nbytes_in_layer(il) for il in layout.layers}, budget)
    read = 0
    for (il, experts), ids in zip(rec.unions, rec.ids, strict=True):
        rows = [list(r) for r in ids.reshape(-1, ids.shape[-1])]
        counts = [sum(e in r for r in rows) for e in experts]
        last = [max(i for i, r in enumerate(rows) if e in r) for e in experts]
        _, misses, _ = policy.plan(il, list(experts), Uses(len(rows), counts, last))
        policy.admit(il, misses)
        read += len(misses) * layout.expert_nbytes_in_layer(il)
    return policy.hits, policy.misses, policy.evictions, read


def _streamed(
    path: Path, budget: Budget, slots: bool = False, **opts: object
) -> tuple[list[int], np.ndarray, Streamer, Recorder, ExpertHook]:
    layout = read_layout(path)
    streamer = Streamer(layout, StreamSettings(**opts), budget=budget, warn=lambda m: None, slots=slots)
    rec = Recorder(streamer)
    hook = ExpertHook(rec, lookup(layout.arch))
    tokens, logits = run(path, hook)
    return tokens, logits, streamer, rec, hook


@pytest.mark.parametrize("arch,quant", MODELS)
def test_cache_off_is_bit_identical_and_reads_exactly_the_routed_slices(
    tiny_models: Callable[[str, str], Path], arch: str, quant: str
) -> None:
    path = tiny_models(arch, quant)
    layout = read_layout(path)
    tokens, logits, streamer, rec, hook = _streamed(path, Budget(0, layout.floor_bytes(), "off"))
    try:
        ref_tokens, ref_logits = plain(path)
        assert tokens == ref_tokens
        assert np.array_equal(logits, ref_logits)  # bit for bit, not allclose
        assert set(hook.bound) == {t.name for t in layout.experts}  # every expert tensor rebound
        routed = sum(len(u) for _, u in rec.unions)
        routed_bytes = sum(len(u) * layout.expert_nbytes_in_layer(il) for il, u in rec.unions)
        s = streamer.stats()
        assert len(rec.unions) == N_GEN * len(layout.layers)  # one route per MoE layer per ubatch
        assert s.routed == routed and s.misses == routed and s.hits == 0
        assert s.read_bytes == routed_bytes  # Q4_K_M mixes Q4_K/Q6_K: bytes differ per layer
        assert len(rec.unions[0][1]) > layout.n_expert_used  # the prompt's ubatch reads its union once
    finally:
        streamer.close()


@pytest.mark.parametrize("slots", [True, False], ids=["slots", "pages"])
@pytest.mark.parametrize("arch,quant", MODELS)
def test_evicting_cache_is_bit_identical(
    tiny_models: Callable[[str, str], Path], arch: str, quant: str, slots: bool
) -> None:
    path = tiny_models(arch, quant)
    layout = read_layout(path)
    one = layout.expert_nbytes_in_layer(layout.layers[0])
    budget = layout.floor_bytes() + one  # floor + one expert: evicts on every token
    tokens, logits, streamer, rec, hook = _streamed(
        path, Budget(budget, layout.floor_bytes(), "fixed"), io_threads=3, slots=slots
    )
    try:
        assert isinstance(streamer.cache, SlotCache) == slots == hook.slots
        ref_tokens, ref_logits = plain(path)
        assert tokens == ref_tokens
        assert np.array_equal(logits, ref_logits)
        s = streamer.stats()
        assert s.hits + s.misses == s.routed == sum(len(u) for _, u in rec.unions)
        assert s.evictions > 0 and s.hits > 0
        assert (s.hits, s.misses, s.evictions, s.read_bytes) == reference_counts(layout, budget, rec)
        assert s.resident_bytes <= s.budget_bytes
    finally:
        streamer.close()


@contextmanager
def _streamer(path: Path, *, slots: bool = False) -> Iterator[Streamer]:
    """A streamer of ``path``, closed afterwards: the cache off, or with ``slots`` a slot cache of
    one layer's experts over the floor (so it evicts)."""
    layout = read_layout(path)
    budget = (
        Budget(layout.floor_bytes() + layout.expert_nbytes_in_layer(layout.layers[0]), 0, "fixed")
        if slots
        else Budget(0, 0, "off")
    )
    streamer = Streamer(layout, StreamSettings(), budget=budget, warn=lambda m: None, slots=slots)
    try:
        yield streamer
    finally:
        streamer.close()


def test_sabotaged_streamer_changes_logits(tiny_models: Callable[[str, str], Path]) -> None:
    """Proof that the matmuls read bmoe's buffers: if nothing is read, the output changes."""
    path = tiny_models("qwen3moe", "q8_0")
    with _streamer(path) as streamer:
        hook = ExpertHook(Recorder(streamer, sabotage=True), lookup(streamer.layout.arch))
        _, logits = run(path, hook)
        assert not np.array_equal(logits, plain(path)[1])


class _Unnumbered(Recorder):
    """Slots, but the ids are left as the router gave them (the slot map is the identity)."""

    def slot_map(self, il: int) -> np.ndarray:
        return np.arange(self.inner.layout.n_expert, dtype=np.int32)


def test_slots_without_renumbering_change_logits(tiny_models: Callable[[str, str], Path]) -> None:
    """Proof that the renumbering is what makes slots exact: the same slots read by the router's
    own ids give other logits (the experts' bytes sit in other slots than their ids)."""
    path = tiny_models("qwen3moe", "q8_0")
    with _streamer(path, slots=True) as streamer:
        hook = ExpertHook(_Unnumbered(streamer), lookup(streamer.layout.arch))
        assert hook.slots
        _, logits = run(path, hook)
        assert not np.array_equal(logits, plain(path)[1])


def test_a_matmul_before_its_renumbering_is_refused(tiny_models: Callable[[str, str], Path]) -> None:
    """The guard behind slots: if the weights node never came (here: the hook is made to look for
    a node no graph has), the first expert matmul stops the graph instead of reading slots by the
    router's ids."""
    path = tiny_models("qwen3moe", "q8_0")
    with _streamer(path, slots=True) as streamer:
        hook = ExpertHook(streamer, lookup(streamer.layout.arch))
        hook._route_prefix = b"no-such-node-"
        with pytest.raises(Exception, match="expert matmul came before its no-such-node-0"):
            run(path, hook)
        assert streamer.stats().n_routes == 0  # nothing was computed on a slot


def test_a_kept_error_aborts_llama_decode(tiny_models: Callable[[str, str], Path]) -> None:
    path = tiny_models("qwen3moe", "q8_0")
    with _streamer(path) as streamer:
        hook = ExpertHook(streamer, lookup(streamer.layout.arch))
        hook.error = HookError("kept from an earlier call")
        rcs: list[int] = []
        with pytest.raises(HookError, match="kept from an earlier call"):
            run(path, hook, rcs=rcs)
        assert rcs == [2]  # llama_decode: aborted, before any node ran (no route was taken)
        assert hook.n_routes == 0


def test_changed_file_is_sticky_and_aborts_decode(tiny_models: Callable[[str, str], Path], tmp_path: Path) -> None:
    path = tmp_path / "copy.gguf"
    shutil.copyfile(tiny_models("qwen3moe", "q8_0"), path)
    with _streamer(path) as streamer:
        hook = ExpertHook(streamer, lookup(streamer.layout.arch))
        path.touch()  # same bytes, new mtime: the file "changed under the session"
        with pytest.raises(Exception, match="changed while streaming"):
            run(path, hook)
        assert hook.error is not None and streamer.error is not None
        with pytest.raises(Exception, match="changed while streaming"):
            streamer.on_route(streamer.layout.layers[0], np.array([[0, 1]]))


def _read_bytes() -> int:
    for line in open("/proc/self/io"):
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise AssertionError("no read_bytes in /proc/self/io")


def _evict_page_cache(path: Path) -> None:
    """Drop this file's clean cached pages (no root needed, unlike drop_caches)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _bytes_read_by_load(path: Path, lazy: int) -> int:
    _evict_page_cache(path)
    mp = llama_cpp.llama_model_default_params()
    mp.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP
    mp.lazy_mode = lazy
    mp.use_extra_bufts = False
    r0 = _read_bytes()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
    read = _read_bytes() - r0
    assert model
    llama_cpp.llama_model_free(model)
    return read


def test_mmap_load_reads_the_whole_file_and_the_dense_twin_only_dense(
    tiny_models: Callable[[str, str], Path], tmp_path: Path
) -> None:
    """The load-time finding of docs/streaming.md, measured with /proc/self/io read_bytes."""
    # a copy of its own, so no other reader of the shared tiny file (a parallel worker) warms its pages
    path = Path(shutil.copy(tiny_models("qwen3moe", "f32"), tmp_path / "model.gguf"))
    layout = read_layout(path)
    size = path.stat().st_size
    probe = _bytes_read_by_load(path, llama_cpp.LLAMA_LAZY_MODE_OFF)
    # MAP_POPULATE reads everything, and lazy_mode ON changes nothing for qwen3moe.
    assert probe >= size - (1 << 20)
    assert _bytes_read_by_load(path, llama_cpp.LLAMA_LAZY_MODE_ON) >= size - (1 << 20)
    twin = dense_twin(layout, tmp_path / "twins")
    assert allocated_bytes(twin) < layout.dense_nbytes + (4 << 20) < size
    assert _bytes_read_by_load(twin, llama_cpp.LLAMA_LAZY_MODE_OFF) <= allocated_bytes(twin) + (1 << 20)


@pytest.mark.parametrize("arch,quant", [("qwen3moe", "q8_0"), ("qwen35moe", "q4_k_m")])
def test_streaming_over_the_dense_twin_is_bit_identical(
    tiny_models: Callable[[str, str], Path], tmp_path: Path, arch: str, quant: str
) -> None:
    path = tiny_models(arch, quant)
    layout = read_layout(path)  # experts are read from the original...
    twin = dense_twin(layout, tmp_path / "twins")  # ...llama.cpp loads the twin (zeros for experts)
    streamer = Streamer(layout, StreamSettings(), budget=Budget(0, 0, "off"), warn=lambda m: None)
    hook = ExpertHook(streamer, lookup(layout.arch))
    try:
        tokens, logits = run(twin, hook)
        assert tokens == plain(path)[0]
        assert np.array_equal(logits, plain(path)[1])
    finally:
        streamer.close()


def test_small_ubatches_route_once_per_ubatch_and_stay_identical(tiny_models: Callable[[str, str], Path]) -> None:
    path = tiny_models("qwen35moe", "q8_0")
    layout = read_layout(path)
    ref_tokens, ref_logits = run(path, None, n_ubatch=4)  # same ubatch shapes as the streamed run
    streamer = Streamer(layout, StreamSettings(), budget=Budget(layout.floor_bytes(), 0, "fixed"), warn=lambda m: None)
    rec = Recorder(streamer)
    try:
        tokens, logits = run(path, ExpertHook(rec, lookup(layout.arch)), n_ubatch=4)
        assert tokens == ref_tokens and np.array_equal(logits, ref_logits)
        n_ubatches = -(-len(PROMPT) // 4) + N_GEN - 1
        assert len(rec.unions) == n_ubatches * len(layout.layers)
    finally:
        streamer.close()
