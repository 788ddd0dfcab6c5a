"""How token lists are packed into llama_decode calls (bmoe.runtime.forks.pack_calls): every list
one piece of its own width class, the call one ubatch once padded (docs/decide.md "Batches")."""

from __future__ import annotations

import pytest

from bmoe.runtime.forks import FA_TILE_ROWS, pack_calls, width_class


def test_width_classes_are_the_kernels_bounds() -> None:
    assert [width_class(n) for n in (1, 2, FA_TILE_ROWS - 1, FA_TILE_ROWS, 500)] == [0, 1, 1, 2, 2]


@pytest.mark.parametrize(
    ("lengths", "n_ubatch", "calls"),
    [
        ([36, 38, 38, 35], 512, [[0, 1, 2, 3]]),  # one class: one call, padded to 38
        ([36, 87, 38, 38, 35], 512, [[0, 2, 3, 4], [1]]),  # 87 would pull the others into the tiled kernel
        ([1, 4, 1, 2], 512, [[0], [1, 3], [2]]),  # one-token lists alone
        ([30, 30, 30], 64, [[0, 1], [2]]),  # padded, a call fills at most one ubatch
        ([10, 600, 10], 512, [[0, 2], [1]]),  # longer than a ubatch: alone
    ],
)
def test_pack_calls(lengths: list[int], n_ubatch: int, calls: list[list[int]]) -> None:
    got = pack_calls(lengths, n_ubatch, 512)
    assert got == calls
    assert sorted(i for call in got for i in call) == list(range(len(lengths)))
    for call in got:
        assert len({width_class(lengths[i]) for i in call}) == 1
        assert len(call) == 1 or max(lengths[i] for i in call) * len(call) <= min(n_ubatch, 512)


def test_one_token_lists_alone() -> None:
    assert pack_calls([1, 1, 3, 1, 3], 512, 512) == [[0], [1], [2, 4], [3]]


def test_unpadded_calls_hold_one_length() -> None:
    lengths = [36, 38, 38, 35, 36, 38]
    got = pack_calls(lengths, 512, 512, pad=False)
    assert got == [[0, 4], [1, 2, 5], [3]]
    assert all(len({lengths[i] for i in call}) == 1 for call in got)
    assert pack_calls([30] * 5, 64, 512, pad=False) == [[0, 1], [2, 3], [4]]
    assert pack_calls([1, 1, 2], 512, 512, pad=False) == [[0], [1], [2]]
