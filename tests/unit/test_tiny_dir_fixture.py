"""The ``tiny_dir`` fixture works with pytest's cache plugin and without it
(``-p no:cacheprovider`` leaves no ``config.cache``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_dir_is_a_writable_folder(tiny_dir: Path) -> None:
    assert tiny_dir.is_dir()
    probe = tiny_dir / f".probe-{os.getpid()}"
    probe.write_bytes(b"x")
    probe.unlink()


def test_tiny_dir_without_the_cache_plugin(tmp_path: Path) -> None:
    """The test above in a pytest run with the cache plugin off: tiny_dir falls back to
    bmoe.testing's default folder (under $HOME, here a temporary one)."""
    env = {k: v for k, v in os.environ.items() if k != "BMOE_TINY_DIR"} | {"HOME": str(tmp_path)}
    test = f"{Path(__file__).relative_to(ROOT)}::test_tiny_dir_is_a_writable_folder"
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", test],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "1 passed" in p.stdout
    assert (tmp_path / ".cache" / "bmoe" / "tiny").is_dir()
