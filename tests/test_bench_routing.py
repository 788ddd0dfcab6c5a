"""Routing presets of bench/synthetic_moe.py and the statistics of bench/routing_stats.py.

The presets must keep the uniform model's bytes (its recipe hash leaves unset knobs out) and put
the popularity knob exactly where the module docstring says; the statistics must count what
docs/benchmarks.md says they count, and a written route trace must replay in bench/cache_replay.py.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import gguf  # noqa: E402
import synthetic_moe as sm  # noqa: E402
from cache_replay import read_trace  # noqa: E402
from routing_stats import ModelRun, layer_stats, read_decode_routes, summarize, top_k, write_route_trace  # noqa: E402

ORIGINAL_FIELDS = {
    "n_layer",
    "n_embd",
    "n_head",
    "n_head_kv",
    "head_dim",
    "n_expert",
    "n_expert_used",
    "n_ff_exp",
    "n_vocab",
    "n_ctx_train",
    "rope_theta",
    "rms_eps",
    "embed_std",
    "out_scale",
    "seed",
}
TINY = sm.SyntheticSpec(
    n_layer=2,
    n_embd=128,
    n_head=2,
    n_head_kv=1,
    head_dim=64,
    n_expert=16,
    n_expert_used=4,
    n_ff_exp=64,
    skew=(0.5, 2.0),
    label="tinytrace",
)


def test_uniform_preset_keeps_the_original_recipe_and_name(tmp_path: Path) -> None:
    assert sm.PRESETS["uniform"] == sm.SyntheticSpec()
    assert set(sm._hashed_fields(sm.PRESETS["uniform"])) == ORIGINAL_FIELDS
    assert sm.recipe(sm.PRESETS["uniform"]) != sm.recipe(sm.PRESETS["trace"])
    assert set(sm._hashed_fields(sm.PRESETS["trace"])) == ORIGINAL_FIELDS | {"skew", "reuse", "label"}
    assert sm.PRESETS["trace"].n_layer == sm.SyntheticSpec().n_layer
    with pytest.raises(ValueError, match="unknown preset"):
        sm.preset_path(tmp_path, "zipf")


def test_skew_is_interpolated_over_the_layers() -> None:
    spec = sm.SyntheticSpec(n_layer=5, skew=(0.0, 1.0, 3.0))
    assert [spec.skew_of(il) for il in range(5)] == [0.0, 0.5, 1.0, 2.0, 3.0]
    assert sm.SyntheticSpec().skew_of(3) == 0.0


def test_u_blocks_dequantize_to_u_exactly() -> None:
    u = sm.skew_vector(sm.PRESETS["trace"])
    assert sorted(set(np.abs(u).tolist())) == [4.0] and len(u) == sm.SKEW_DIMS
    back = gguf.quants.dequantize(sm._sign_blocks(np.sign(u), 4.0).reshape(-1), gguf.GGMLQuantizationType.Q4_0)
    assert np.array_equal(back.reshape(-1), u)


@pytest.fixture(scope="module")
def tiny_trace_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sm.write_synthetic(tmp_path_factory.mktemp("routing"), TINY)


def test_tiny_preset_puts_popularity_where_the_docstring_says(tiny_trace_model: Path) -> None:
    assert tiny_trace_model.name == "synthetic-qwen3moe-2L-tinytrace-q4_0.gguf"
    t = {x.name: x for x in gguf.GGUFReader(tiny_trace_model).tensors}
    u = sm.skew_vector(TINY)
    emb = gguf.quants.dequantize(t["token_embd.weight"].data, gguf.GGMLQuantizationType.Q4_0)
    assert emb.shape == (TINY.n_vocab, TINY.n_embd)
    assert np.array_equal(emb[:, : sm.SKEW_DIMS], np.broadcast_to(u, (TINY.n_vocab, sm.SKEW_DIMS)))
    assert np.count_nonzero(emb[:, sm.SKEW_DIMS :].std(axis=0) == 0) == 0  # the token part still varies
    norm = np.asarray(t["output_norm.weight"].data)
    assert np.count_nonzero(norm[: sm.SKEW_DIMS]) == 0 and np.count_nonzero(norm[sm.SKEW_DIMS :]) == TINY.n_embd - 64
    for il in range(TINY.n_layer):
        router = np.asarray(t[f"blk.{il}.ffn_gate_inp.weight"].data)
        col = router[:, 0] / u[0]
        assert np.allclose(router[:, : sm.SKEW_DIMS], np.outer(col, u), rtol=1e-6, atol=0)
        # The bias per expert is skew * p_e token-logit standard deviations (docstring).
        x_rms = np.sqrt((TINY.n_embd - 64 + 64 * 16) / TINY.n_embd)
        bias = col * float(u @ u) / x_rms
        token_std = np.sqrt((TINY.n_embd - 64) / TINY.n_embd) / x_rms
        assert np.allclose(bias, TINY.skew_of(il) * token_std * sm.popularity(TINY, il), rtol=1e-5)


def test_uniform_and_skewed_tiny_models_differ_only_in_the_knob_tensors(tmp_path: Path, tiny_trace_model: Path) -> None:
    plain = sm.write_synthetic(tmp_path, dataclasses.replace(TINY, skew=(), label=""))
    a = {x.name: np.asarray(x.data) for x in gguf.GGUFReader(plain).tensors}
    b = {x.name: np.asarray(x.data) for x in gguf.GGUFReader(tiny_trace_model).tensors}
    differ = sorted(n for n in a if not np.array_equal(a[n], b[n]))
    assert differ == [
        "blk.0.ffn_gate_inp.weight",
        "blk.1.ffn_gate_inp.weight",
        "output_norm.weight",
        "token_embd.weight",
    ]


def test_layer_stats_count_exactly() -> None:
    # 4 tokens, 1 layer, k = 2, 16 experts; 10 distinct would need more tokens: 6 here.
    routes = np.array([[[0, 1]], [[1, 2]], [[0, 1]], [[3, 4]]])
    per = layer_stats(routes, 16)
    assert per["distinct"] == [5.0]
    assert per["hot8"] == [1.0]  # 5 experts: the 8 hottest carry everything
    assert per["lag1"] == [pytest.approx((1 / 2 + 1 / 2 + 0) / 3)]
    assert per["lag2"] == [pytest.approx((2 / 2 + 0) / 2)]
    assert np.isnan(per["lag8"][0]) and np.isnan(per["lag32"][0])
    wide = np.array([[[e, e + 1]] for e in range(0, 20, 2)])  # 10 tokens, 20 experts used once each
    s = summarize(layer_stats(wide, 32))
    assert s["distinct"] == 20.0 and s["hot8"] == 8 / 20 and s["lag1"] == 0.0 and s["lag8"] == 0.0
    assert s["layer0_distinct"] == 20.0


def test_top_k_orders_by_probability_then_id() -> None:
    probs = np.array([[0.1, 0.4, 0.1, 0.4]])
    assert top_k(probs, 3).tolist() == [[1, 3, 0]]


def _dequant(spec: sm.SyntheticSpec, name: str) -> np.ndarray:
    t = next(x for x in sm.tensor_plan(spec) if x.name == name)
    data = sm.tensor_data(spec, t)
    if not t.quant:
        return data
    return gguf.quants.dequantize(data, gguf.GGMLQuantizationType.Q4_0).reshape(t.shape)


def _rope_neox(x: np.ndarray, pos: int, theta_base: float) -> np.ndarray:
    half = len(x) // 2
    ang = pos * theta_base ** (-2.0 * np.arange(half) / len(x))
    c, s = np.cos(ang), np.sin(ang)
    return np.concatenate([x[:half] * c - x[half:] * s, x[:half] * s + x[half:] * c])


def test_previous_token_head_attends_to_distance_one() -> None:
    spec, il = sm.PRESETS["trace"], 3
    hd, eps = spec.head_dim, spec.rms_eps
    emb = np.concatenate([sm.skew_vector(spec), np.random.default_rng(5).standard_normal(spec.n_embd - 64)])
    x = emb / np.sqrt(np.mean(emb**2))  # attn_norm without its weight: only u reaches q and k
    wq, wk = _dequant(spec, f"blk.{il}.attn_q.weight"), _dequant(spec, f"blk.{il}.attn_k.weight")
    qn, kn = _dequant(spec, f"blk.{il}.attn_q_norm.weight"), _dequant(spec, f"blk.{il}.attn_k_norm.weight")
    heads = spec.n_head // spec.n_head_kv
    assert np.count_nonzero(wq[: heads * hd, 64:]) == 0 and np.count_nonzero(wk[:hd, 64:]) == 0
    for h in range(heads):
        q = wq[h * hd : (h + 1) * hd] @ x
        k = wk[:hd] @ x
        q = q / np.sqrt(np.mean(q**2) + eps) * qn
        k = k / np.sqrt(np.mean(k**2) + eps) * kn
        t = 300
        scores = np.array(
            [_rope_neox(q, t, spec.rope_theta) @ _rope_neox(k, t - d, spec.rope_theta) for d in range(t + 1)]
        ) / np.sqrt(hd)
        assert int(np.argmax(scores)) == 1
        assert scores[1] - np.delete(scores, 1).max() > 8.0  # the previous token takes > 99.9% of 300
    # v copies the router's dims 1:1, attn_output adds reuse_l times head 0's copy back onto them.
    lo, hi = sm.reuse_dims(spec)
    wv, wo = _dequant(spec, f"blk.{il}.attn_v.weight"), _dequant(spec, f"blk.{il}.attn_output.weight")
    assert np.array_equal(wv[:hd], np.eye(spec.n_embd, dtype=np.float32)[lo:hi])
    expect = np.zeros((hi - lo, spec.n_head * hd), dtype=np.float32)
    expect[:, :hd] = np.eye(hd) * np.float32(np.float16(spec.reuse_of(il)))
    assert np.array_equal(wo[lo:hi], expect)
    router = _dequant(spec, f"blk.{il}.ffn_gate_inp.weight")
    assert np.count_nonzero(router[:, hi:]) == 0 and np.count_nonzero(router[:, lo:hi]) == spec.n_expert * hd
    assert np.count_nonzero(_dequant(spec, "output_norm.weight")[:hi]) == 0


def test_written_route_trace_replays(tmp_path: Path, tiny_trace_model: Path) -> None:
    rng = np.random.default_rng(3)
    prefill, decode = rng.random((5, 2, TINY.n_expert)), rng.random((7, 2, TINY.n_expert))
    run = ModelRun(tiny_trace_model, [0, 1], TINY.n_expert_used, prefill, decode, list(range(7)), 1.0)
    out = tmp_path / "tiny.route.csv"
    write_route_trace(run, out)
    routes, n_expert = read_decode_routes(out)
    assert n_expert == TINY.n_expert and np.array_equal(routes, top_k(decode, TINY.n_expert_used))
    trace = read_trace(out)
    one_expert = 3 * TINY.n_ff_exp * TINY.n_embd // 32 * 18
    assert trace.expert_bytes == {0: one_expert, 1: one_expert}
    assert [b.decode for b in trace.batches].count(False) == 2  # the prefill: one batch per layer
    assert len(trace.batches) == 2 + 7 * 2
    # the last layer routes only the prompt's last token, as llama.cpp (and the recorded traces) do
    assert [len(b.tokens) for b in trace.batches[:2]] == [5, 1]
    assert trace.batches[1].tokens[0] == tuple(top_k(prefill, TINY.n_expert_used)[-1, 1].tolist())
