"""Expert bytes overwritten in place, keeping size, mtime and inode (issue #12 item 7): the sampled
content check makes it the same sticky error as any other file that changed under a session,
and a session opened afterwards streams the new bytes over a twin of the new file."""

import os
import re
import shutil
import time
from pathlib import Path

import pytest

from bmoe.config import SessionConfig
from bmoe.errors import StreamFailedError
from bmoe.runtime.results import GenerateRequest
from bmoe.session import Session
from bmoe.stream import FileChangedError, read_layout
from bmoe.stream.content import CHECK_EVERY_S
from bmoe.stream.twin import dense_ranges


def overwrite_in_place(model: Path, dst: tuple[int, int], src: tuple[int, int]) -> None:
    """Copy bytes src onto dst inside ``model``; size, mtime and inode stay as they were."""
    st = model.stat()
    with open(model, "r+b") as f:
        f.seek(src[0])
        data = f.read(src[1] - src[0])
        assert len(data) == dst[1] - dst[0]
        f.seek(dst[0])
        f.write(data)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = model.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


def expert_range(model: Path, name: str) -> tuple[int, int]:
    t = read_layout(model).by_name()[name]
    return t.offset, t.offset + t.nbytes


@pytest.fixture()
def model(tiny_models, tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    shutil.copyfile(tiny_models("qwen3moe", "q8_0"), path)
    return path


def test_expert_bytes_overwritten_in_place_are_a_sticky_error_naming_the_file(model: Path, tmp_path: Path) -> None:
    s = Session(SessionConfig(model=model, moe_stream=True, twin_dir=tmp_path / "twins", n_ctx=128, n_threads=1))
    try:
        assert s.generate(GenerateRequest(prompt="Hi", n_predict=4)).n_tokens == 4
        # Layer 0's down projections now hold layer 1's: a real model's bytes, just not these.
        overwrite_in_place(
            model, expert_range(model, "blk.0.ffn_down_exps.weight"), expert_range(model, "blk.1.ffn_down_exps.weight")
        )
        time.sleep(CHECK_EVERY_S + 0.1)  # the next check is due: a user's next request comes later than this
        with pytest.raises(
            StreamFailedError,
            match=rf"^expert streaming failed: model file {re.escape(str(model))} "
            r"changed while streaming: .*overwritten in place.*"
            r"this session cannot continue, open a new one$",
        ) as e:
            s.generate(GenerateRequest(prompt="Hi", n_predict=4))
        assert isinstance(e.value.__cause__, FileChangedError)
        with pytest.raises(StreamFailedError, match="overwritten in place"):  # sticky
            s.generate(GenerateRequest(prompt="Hi", n_predict=1))
        assert s.streaming.streamer.reader.content_checks >= 2  # at open, then on schedule
    finally:
        s.close()


def test_a_session_opened_after_an_in_place_overwrite_uses_the_new_bytes(model: Path, tmp_path: Path) -> None:
    """The twin holds the dense weights: one made before the overwrite must not be reused after
    it. The streamed run must equal the resident run of the file as it is now."""
    twins = tmp_path / "twins"
    cfg = dict(model=model, twin_dir=twins, n_ctx=128, n_threads=1)
    with Session(SessionConfig(moe_stream=True, **cfg)) as s:
        before = s.generate(GenerateRequest(prompt="Hi", n_predict=8)).tokens
    (a1, b1), (a2, b2) = dense_ranges(read_layout(model), 0)[1:3]  # layer 1's dense tensors get layer 2's
    overwrite_in_place(model, (a1, b1), (a2, b2))
    overwrite_in_place(
        model, expert_range(model, "blk.0.ffn_down_exps.weight"), expert_range(model, "blk.1.ffn_down_exps.weight")
    )
    with Session(SessionConfig(**cfg)) as s:
        resident = s.generate(GenerateRequest(prompt="Hi", n_predict=8)).tokens
    with Session(SessionConfig(moe_stream=True, **cfg)) as s:
        streamed = s.generate(GenerateRequest(prompt="Hi", n_predict=8)).tokens
    assert streamed == resident
    assert resident != before  # the overwrite mattered
