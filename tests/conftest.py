"""Fixtures shared by every test folder."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """``tiny_models(arch, quant) -> Path`` of a tiny fixture GGUF (bmoe.testing), written once per
    test session, or reused across sessions from ``$BMOE_TINY_DIR`` when that is set."""
    from bmoe.testing import write_tiny

    env = os.environ.get("BMOE_TINY_DIR")
    out_dir = Path(env) if env else tmp_path_factory.mktemp("tiny")

    def tiny_model(arch: str, quant: str = "f32") -> Path:
        return write_tiny(arch, quant, out_dir)

    return tiny_model
