"""--dense-weights anon|mmap: where the dense weights live does not change a bit of the output.

Same comparison as G1 (64 greedy tokens and a perplexity run, logits bit for bit) on every gated
variant, with the cache off, once with the dense weights moved into anonymous memory (``anon``, the
default when streaming, which G1-G4 therefore run too) and once mapped from the dense twin
(``mmap``). Each run also checks what it holds: anon holds every dense page llama.cpp maps in
anonymous memory, all of it in RAM; mmap holds none.
"""

import mmap

import pytest

from helpers.gates import VARIANTS, assert_same, opener, run


@pytest.fixture(params=VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}")
def variant(request, tiny_models, open_session, tmp_path):
    return opener(request.param, tiny_models, open_session, tmp_path)


@pytest.mark.parametrize("mode", ["anon", "mmap"])
def test_dense_weights_anon_and_mmap_equal_resident(variant, mode) -> None:
    open_, resident = variant
    s = open_(moe_stream=True, cache_mb=0, dense_weights=mode)
    assert s.streaming.dense_weights == mode
    if mode == "anon":
        # every dense tensor, in whole pages: at most the two partial pages at the ends of each span more
        spans = s.streaming.dense.spans
        dense = s.streaming.layout.dense_nbytes
        assert s.dense_anon_bytes == sum(hi - lo for lo, hi in spans)
        assert dense <= s.dense_anon_bytes <= dense + 2 * mmap.PAGESIZE * len(spans)
        assert s.dense_resident_frac() == 1.0
    else:
        assert s.dense_anon_bytes == 0
    assert_same(resident, run(s))
