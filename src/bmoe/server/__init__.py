"""bmoe-server: an OpenAI-compatible HTTP server and a web page over one bmoe session (docs/server.md)."""
from bmoe.server.app import ServerSettings, close_app, create_app

__all__ = ["ServerSettings", "close_app", "create_app"]
