"""--n-expert-used K without loading a model: the layout that routes K (its floor, the budget, the
read-ahead's guess), the llama.cpp override array, and BMOE_READY's keys. The config's refusals
are in test_config.py; what the model allows, and the runs, in tests/engine/test_n_expert_used.py
and the gate tests/gates/test_n_expert_used_exact.py."""

from __future__ import annotations

import ctypes
import json

import pytest

from bmoe.stream import StreamSettings, lookup, read_layout
from bmoe.stream.budget import MIB, CacheBudgetError, resolve_budget
from bmoe.stream.prefetch import RouterGuess, wide_cut
from bmoe.wire import records


@pytest.fixture(scope="module")
def layout(tiny_models):
    return read_layout(tiny_models("qwen3moe", "q8_0"))  # 16 experts, 2 per token


def test_the_floor_is_k_experts_per_layer(layout) -> None:
    assert (layout.n_expert, layout.n_expert_used) == (16, 2)
    one_each = sum(layout.expert_nbytes_in_layer(il) for il in layout.layers)
    for k in (1, 2, 5, 16):
        narrowed = layout.with_n_expert_used(k)
        assert narrowed.n_expert_used == k and narrowed.floor_bytes() == k * one_each
        assert narrowed.experts == layout.experts and narrowed.files == layout.files  # only K changes
    assert layout.n_expert_used == 2  # a new layout: the file's stays as it was


@pytest.mark.parametrize("k", [0, -1, 17, True, 2.0])
def test_a_k_the_layout_cannot_route_is_refused(layout, k: object) -> None:
    with pytest.raises(ValueError, match=r"^n_expert_used must be an integer in 1\.\.16, got "):
        layout.with_n_expert_used(k)  # type: ignore[arg-type]


def test_the_cache_floor_follows_k(layout) -> None:
    """1 MiB is under one token's routed experts at the model's 2 (about 1.6 MiB in Q8_0) and above them at 1."""
    settings = StreamSettings(cache_mb=1)
    with pytest.raises(CacheBudgetError, match=r"^cache_mb: 1 is below the floor of 2 MiB, .*\(4 layers x 2 experts"):
        resolve_budget(settings, layout)
    budget = resolve_budget(settings, layout.with_n_expert_used(1))
    assert budget.budget_bytes == MIB and budget.floor_bytes == layout.floor_bytes() // 2


def test_the_read_ahead_guesses_half_of_k_and_its_wide_cut_follows_k(layout) -> None:
    entry = lookup("qwen3moe")
    own, wide = RouterGuess.load(layout, entry), RouterGuess.load(layout.with_n_expert_used(6), entry)
    assert (own.k, own.wide) == (1, wide_cut(16, 2)) == (1, 24)
    assert (wide.k, wide.wide) == (3, wide_cut(16, 6)) == (3, 8)


def test_the_override_array_is_what_llama_cpp_reads() -> None:
    import llama_cpp

    from bmoe.llama.model import kv_overrides

    assert kv_overrides(()) is None
    arr = kv_overrides((("qwen3moe.expert_used_count", 4), ("x.y", 7)))
    assert len(arr) == 3 and ctypes.sizeof(llama_cpp.llama_model_kv_override) * 3 == ctypes.sizeof(arr)
    got = [(e.tag, e.key, e.value.val_i64) for e in arr[:2]]
    assert got == [
        (llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, b"qwen3moe.expert_used_count", 4),
        (llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, b"x.y", 7),
    ]
    assert arr[2].key == b""  # the empty key ends the array
    with pytest.raises(ValueError, match="longer than 127 bytes"):
        kv_overrides((("k" * 128, 1),))


def test_ready_names_the_routed_k_and_the_file_s_own() -> None:
    def ready(**kw: object) -> dict:
        text = records.ready(
            load_s=1.0,
            arch="qwen3moe",
            n_ctx=256,
            think_ctl="none",
            model="m",
            streaming=False,
            decide=False,
            load_read_mib=0.0,
            **kw,
        )
        return json.loads(text.removeprefix("BMOE_READY "))

    r = ready(n_expert_used=2, n_expert_used_gguf=8)
    assert (r["n_expert_used"], r["n_expert_used_gguf"]) == (2, 8)
    r = ready(n_expert_used=8)  # not overridden: the same
    assert (r["n_expert_used"], r["n_expert_used_gguf"]) == (8, 8)
