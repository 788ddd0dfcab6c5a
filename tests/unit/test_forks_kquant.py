"""The K-quant bound on packing (bmoe.runtime.forks.RowLimits): llama.cpp's tiled K-quant matmul
takes a product from 8 rows on (ggml_tiled_min_batch), per expert in an MoE layer, so a call of
side-by-side lists must leave every product on the side of 8 it is on alone (issue 38)."""

from __future__ import annotations

import gguf
import pytest

from bmoe.runtime.forks import NO_LIMITS, TILED_MIN_ROWS, RowLimits, batch_limits, pack_calls, row_limits

T = gguf.GGMLQuantizationType
DENSE = RowLimits(dense=True)
EXPERTS = RowLimits(dense=True, experts=True)


def test_limits_from_the_weight_types() -> None:
    q4km_moe = [
        ("blk.0.attn_q.weight", T.Q4_K),
        ("blk.0.ffn_up_exps.weight", T.Q4_K),
        ("blk.0.ffn_down_exps.weight", T.Q6_K),
        ("token_embd.weight", T.Q6_K),
    ]
    assert row_limits(q4km_moe, env={}) == EXPERTS
    # experts in Q8_0, only the dense weights K-quants (SmolLM2 Q4_K_M's ffn_down is Q4_K)
    assert row_limits([("blk.0.ffn_down.weight", T.Q4_K), ("blk.0.ffn_up_exps.weight", T.Q8_0)], env={}) == DENSE
    assert row_limits([("blk.0.ffn_up_exps.weight", T.IQ4_XS)], env={}) == RowLimits(experts=True)
    # types the tiled kernel does not take: no bound
    assert (
        row_limits([("a.weight", T.Q8_0), ("b_exps.weight", T.Q4_0), ("c", T.F32), ("d", T.MXFP4)], env={}) == NO_LIMITS
    )
    # the tiled kernel switched off in the environment: no bound either
    assert row_limits(q4km_moe, env={"GGML_CPU_TILED_MM": "0"}) == NO_LIMITS
    assert row_limits(q4km_moe, env={"GGML_CPU_TILED_MM": "1"}) == EXPERTS


def test_k_quant_experts_share_a_call_only_under_8_rows() -> None:
    # decisions' rest pieces of 10-71 tokens: each alone, where without the bound they filled one call
    lengths = [71, 30, 30, 11, 33, 19, 13, 35]
    assert pack_calls(lengths, 512, 512, pad=False) == [[0], [1, 2], [3], [4], [5], [6], [7]]
    assert pack_calls(lengths, 512, 512, limits=EXPERTS) == [[i] for i in range(8)]
    assert pack_calls([30] * 16, 512, 512, pad=False, limits=EXPERTS) == [[i] for i in range(16)]
    # short ones go together while their rows total under 8
    assert pack_calls([3, 3, 3, 2], 512, 512, limits=EXPERTS) == [[0, 1], [2, 3]]
    assert pack_calls([3, 3, 3], 512, 512, pad=False, limits=EXPERTS) == [[0, 1], [2]]


def test_k_quant_dense_weights_keep_each_side_of_8_rows_and_outputs() -> None:
    # one output row each: at most 7 lists per call, where the output head and the last layer run
    # on a row per output
    assert pack_calls([30] * 16, 512, 512, pad=False, limits=DENSE) == [list(range(7)), list(range(7, 14)), [14, 15]]
    # a list under 8 rows never shares a call with one of 8 or more (padding would move it over),
    # and short ones together stay under 8 rows
    got = pack_calls([5, 20, 2, 9, 3], 512, 512, limits=DENSE)
    assert got == [[0], [1, 3], [2, 4]]  # 5 and 2 padded to 5 would be 10 rows
    for call in got:
        rows = max([5, 20, 2, 9, 3][i] for i in call) * len(call)
        assert len(call) == 1 or rows < TILED_MIN_ROWS or min([5, 20, 2, 9, 3][i] for i in call) >= TILED_MIN_ROWS


@pytest.mark.parametrize("limits", [DENSE, EXPERTS])
def test_full_scoring_outputs(limits: RowLimits) -> None:
    # full scoring asks a row of logits per token: lists of 8 or more rows keep 8 or more outputs
    # beside others, so under dense limits they share calls; short ones stay under 8 rows
    lengths, outs = [9, 10, 12, 2, 2, 2, 2], [9, 10, 12, 1, 1, 1, 1]
    got = pack_calls(lengths, 512, 512, outputs=outs, limits=limits)
    if limits.experts:
        assert got == [[0], [1], [2], [3, 4, 5], [6]]
    else:
        assert got == [[0, 1, 2], [3, 4, 5], [6]]


def test_an_unreadable_header_takes_the_strictest_limits(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.delenv("GGML_CPU_TILED_MM", raising=False)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    assert batch_limits(bad) == EXPERTS
    assert batch_limits(tmp_path / "missing.gguf") == EXPERTS
