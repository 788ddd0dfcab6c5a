"""G19b: glm5-next answers a decide batch one by one, so a batch equals one by one past the
indexer's top-k too.

glm5-next's pooled DSA indexer picked other tokens for a suffix prefilled on a forked side sequence
than for the same suffix alone once the context was longer than its top-k, resident as well as
streamed (docs/streaming.md). Its registry entry says so (``ArchEntry.why_batch_apart``), and the
adapter answers its batches one by one. The suite's tiny glm5-next has a top-k of 1024, above every
context the suite opens; here a copy of it has its ``indexer.top_k`` set to 32, under the longest
prompts' 71 tokens. With the batch side by side, decision 0 scored 0.26 nats off one by one.
"""

from __future__ import annotations

import shutil

import gguf
import pytest

from bmoe.stream.archs import batch_apart
from helpers.decide_prompts import MODES, answers, requests

TOP_K = 32


def with_top_k(src, dst, top_k: int):  # noqa: ANN001
    """``src`` copied to ``dst`` with its indexer's top-k set to ``top_k`` (in place: one u32)."""
    shutil.copyfile(src, dst)
    reader = gguf.GGUFReader(dst, "r+")
    field = reader.fields["glm5-next.attention.indexer.top_k"]
    field.parts[field.data[0]][0] = top_k
    reader.data.flush()
    return dst


@pytest.mark.parametrize("mode", ["resident", "stream-nocache"])
def test_g19b_glm5next_batch_past_the_top_k_equals_one_by_one(tiny_models, open_session, tmp_path, mode: str) -> None:
    model = with_top_k(tiny_models("glm5-next", "q8_0"), tmp_path / "glm5-next-topk8.gguf", TOP_K)
    assert gguf.GGUFReader(model).fields["glm5-next.attention.indexer.top_k"].contents() == TOP_K
    kw = dict(decide=True, decide_batch=4, twin_dir=tmp_path / "twins", **MODES[mode])
    batched, alone = open_session(model, **kw), open_session(model, **kw)
    reqs = requests()  # G19's list: six decisions keep P1, one keeps P2, one refused, one opted out
    got = batched.decide_many(reqs)
    want = [alone.decide(r) for r in reqs]
    assert batch_apart("glm5-next") and max(r.n_tokens for r in got) > TOP_K  # the premise
    assert all(r.batch is None for r in got)  # one by one: no batch
    assert answers(got) == answers(want)
    assert [r.reuse for r in got] == [r.reuse for r in want]  # the kept prefix serves them as one by one
