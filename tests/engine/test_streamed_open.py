"""Opening a streamed session reads the dense weights from flash, not the whole file."""

import os
import shutil
from pathlib import Path

from bmoe.config import SessionConfig
from bmoe.session import Session
from bmoe.stream import read_layout


def evict(path: Path) -> None:
    """Drop the file's clean pages from the page cache (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_streamed_open_reads_dense_bytes_only(tiny_models, tmp_path: Path) -> None:
    # a copy of its own: its page cache is this test's alone, whatever other tests (or a parallel
    # worker) read from the shared tiny file meanwhile
    model = Path(shutil.copy(tiny_models("qwen3moe", "f32"), tmp_path / "model.gguf"))
    size = model.stat().st_size
    dense = read_layout(model).dense_nbytes
    twins = tmp_path / "twins"
    Session(SessionConfig(model=model, moe_stream=True, twin_dir=twins, n_ctx=64)).close()  # writes the twin
    for f in [model, *twins.rglob("*.gguf")]:
        evict(f)
    with Session(SessionConfig(model=model, moe_stream=True, twin_dir=twins, n_ctx=64)) as s:
        # dense weights, plus the header read that the host's read-ahead (8 MiB here) rounds up
        assert 0 < s.load_read_bytes <= dense + (12 << 20) < size * 2 // 3
    evict(model)
    # plan off: a plan reads the header first, and the host's read-ahead brings in ~8 MiB with it,
    # which the load would then find cached
    with Session(SessionConfig(model=model, n_ctx=64, plan="off")) as s:
        assert s.load_read_bytes >= 0.95 * size  # llama.cpp's mmap load populates the whole file


def test_page_residency_follows_the_page_cache(tmp_path: Path) -> None:
    from bmoe.llama.residency import PAGE, PageResidency

    f = tmp_path / "data.bin"
    with open(f, "wb") as out:
        out.write(os.urandom(64 * PAGE))
        out.flush()
        os.fsync(out.fileno())  # dirty pages would survive the eviction
    watch = PageResidency([(f, [(0, 64 * PAGE)])])
    assert watch.n_pages == 64
    evict(f)
    assert watch.fraction() < 0.25
    f.read_bytes()
    assert watch.fraction() == 1.0
    watch.close()


def test_streamed_session_reports_dense_residency(tiny_models, tmp_path: Path) -> None:
    model = tiny_models("qwen3moe", "q8_0")
    with Session(SessionConfig(model=model, moe_stream=True, twin_dir=tmp_path / "twins", n_ctx=64)) as s:
        assert s.dense_resident_frac() > 0.9  # llama.cpp populated the dense weights at load
    with Session(SessionConfig(model=model, n_ctx=64)) as s:
        assert s.dense_resident_frac() == 0.0  # resident sessions: unmeasured


def test_a_file_changed_before_the_reader_opens_it_is_a_setup_error_naming_it(
    tiny_models, tmp_path: Path, monkeypatch
) -> None:
    # The reader checks the shards against the layout when it opens them: a file replaced between
    # the layout's read and that check is refused like any other model-file fault at open.
    import pytest

    from bmoe.runtime.expert_streaming import StreamModelError
    from bmoe.stream.reader import ExpertReader, FileChangedError

    model = tiny_models("qwen3moe", "q8_0")

    def changed(self):  # noqa: ANN001
        raise FileChangedError(f"{model} changed since it was opened")

    monkeypatch.setattr(ExpertReader, "verify_files", changed)
    with pytest.raises(StreamModelError, match=rf"^--moe-stream: {model} changed since it was opened"):
        Session(SessionConfig(model=model, moe_stream=True, twin_dir=tmp_path))


def test_a_failure_after_the_load_frees_the_model_too(tiny_models, tmp_path: Path, monkeypatch) -> None:
    # ExpertStreaming.attach runs after llama.cpp loaded the model; if it raises, the model (with its
    # anonymous dense weights) is freed along with the streamer, not left to the process.
    import pytest

    from bmoe.llama.model import LlamaModel
    from bmoe.runtime.expert_streaming import ExpertStreaming

    closed: list[LlamaModel] = []
    real_close = LlamaModel.close

    def close(self):  # noqa: ANN001
        closed.append(self)
        real_close(self)

    def attach(self, anon):  # noqa: ANN001
        raise ValueError("attach refused")

    monkeypatch.setattr(LlamaModel, "close", close)
    monkeypatch.setattr(ExpertStreaming, "attach", attach)
    model = tiny_models("qwen3moe", "q8_0")
    with pytest.raises(ValueError, match="attach refused"):
        Session(SessionConfig(model=model, moe_stream=True, twin_dir=tmp_path))
    assert len(closed) == 1
    monkeypatch.undo()
    with Session(SessionConfig(model=model, moe_stream=True, twin_dir=tmp_path, n_ctx=64)) as s:
        from bmoe import GenerateRequest

        assert s.generate(GenerateRequest(prompt="Hello", n_predict=2)).n_tokens == 2  # it opens again and runs
