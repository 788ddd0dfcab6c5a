"""Reference tests: bmoe's numbers against an independent implementation (transformers)."""
from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "reference: compares bmoe with transformers (needs the 'reference' extra: torch, transformers)")
