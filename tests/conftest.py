"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def bench_records_elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Benches run by tests write their records to a temporary folder, never into the committed
    bench/results/ (which the page is rendered from: a test's record there would change it)."""
    old = os.environ.get("BMOE_BENCH_RESULTS")
    os.environ["BMOE_BENCH_RESULTS"] = str(tmp_path_factory.mktemp("bench-results"))
    yield
    if old is None:
        os.environ.pop("BMOE_BENCH_RESULTS", None)
    else:
        os.environ["BMOE_BENCH_RESULTS"] = old


@pytest.fixture(scope="session")
def tiny_dir(request: pytest.FixtureRequest) -> Path:
    """Where tiny models are written: ``$BMOE_TINY_DIR`` when set, else pytest's cache folder
    (kept between runs; every file is reused only while its recipe hash is unchanged). With the
    cache plugin off (``-p no:cacheprovider``: no ``config.cache``) it is ``python -m bmoe.testing``'s
    own folder, ``~/.cache/bmoe/tiny``, kept between runs too (files are written to a temporary name
    and renamed, so runs may share it)."""
    from bmoe.testing import default_tiny_dir

    env = os.environ.get("BMOE_TINY_DIR")
    if env:
        return Path(env)
    cache = getattr(request.config, "cache", None)  # absent with -p no:cacheprovider
    if cache is None:
        path = default_tiny_dir()
        path.mkdir(parents=True, exist_ok=True)
        return path
    return cache.mkdir("bmoe-tiny")


@pytest.fixture(scope="session")
def tiny_models(tiny_dir: Path) -> Callable[[str, str], Path]:
    """``tiny_models(arch, quant) -> Path`` of a tiny fixture GGUF: the hand-written qwen3moe and
    qwen35moe (bmoe.testing.write_tiny) or a converted model of a real architecture
    (bmoe.testing.write_hf_arch, docs/tiny-models.md), ``arch`` naming its recipe (a 256-wide one of
    HF_KQUANT_ARCHS for the K-quant gates, a vision-language one of HF_VL_ARCHS for the image tests)."""
    from bmoe.testing import HF_ARCHS, HF_KQUANT_ARCHS, HF_VL_ARCHS, write_hf_arch, write_tiny

    def tiny_model(arch: str, quant: str = "f32") -> Path:
        if arch in HF_ARCHS or arch in HF_KQUANT_ARCHS or arch in HF_VL_ARCHS:
            return write_hf_arch(arch, quant, tiny_dir)
        return write_tiny(arch, quant, tiny_dir)

    return tiny_model


@pytest.fixture()
def unwritable_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder no file can be made in: one without write permission, or, where that does not stop
    the user (root), a read-only /sys; skipped where neither refuses."""
    import tempfile

    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        for candidate in (folder, Path("/sys")):
            try:
                tempfile.TemporaryFile(dir=candidate).close()
            except PermissionError:
                yield candidate
                return
            except OSError:
                continue
        pytest.skip("no folder here refuses to have a file made in it")
    finally:
        folder.chmod(0o755)
