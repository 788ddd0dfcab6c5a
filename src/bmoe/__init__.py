"""bmoe: Mixture-of-Experts inference bigger than RAM, and decisions from one prefill.

The public face: ``Session`` over a ``SessionConfig``, its requests (``GenerateRequest``,
``DecideRequest``) and the root of every error it raises (``BmoeError``). They are loaded on first
use, so that importing a light part of the package (the decide policy, the config) loads no engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_PUBLIC = {
    "Session": "bmoe.session",
    "SessionConfig": "bmoe.config",
    "GenerateRequest": "bmoe.runtime.results",
    "DecideRequest": "bmoe.decide.types",
    "BmoeError": "bmoe.errors",
}
__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
    from bmoe.config import SessionConfig  # noqa: F401 - for type checkers; __getattr__ imports it lazily
    from bmoe.decide.types import DecideRequest  # noqa: F401 - for type checkers; __getattr__ imports it lazily
    from bmoe.errors import BmoeError  # noqa: F401 - for type checkers; __getattr__ imports it lazily
    from bmoe.runtime.results import GenerateRequest  # noqa: F401 - for type checkers; __getattr__ imports it lazily
    from bmoe.session import Session  # noqa: F401 - for type checkers; __getattr__ imports it lazily


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'bmoe' has no attribute {name!r}")
