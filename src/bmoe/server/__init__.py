"""bmoe-server: an OpenAI-compatible HTTP server and a web page over one bmoe session (docs/server.md).

The app is loaded on first use, not with the package: ``bmoe-server`` (bmoe.server.main) checks its
flags and opens the model before it needs FastAPI, so a missing server extra is one clear line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ServerSettings", "close_app", "create_app"]

if TYPE_CHECKING:
    from bmoe.server.app import ServerSettings, close_app, create_app


def __getattr__(name: str) -> Any:
    if name in __all__:
        from bmoe.server import app

        return getattr(app, name)
    raise AttributeError(f"module 'bmoe.server' has no attribute {name!r}")
