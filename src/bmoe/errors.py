"""The error root: every failure a user can cause, or bmoe can meet, is a BmoeError.

Each message is one line that names what was wrong: the user's file, the setting or the request
field. The edges turn them into what their users read: bmoe-cli prints the line and exits 1
(``--session`` first prints a fatal ``BMOE_ERROR`` line), bmoe-server refuses to start with it or
maps a request's error to an HTTP status (docs/server.md).
"""

from __future__ import annotations


class BmoeError(Exception):
    """Base of every error bmoe raises on purpose."""


class ConfigError(BmoeError, ValueError):
    """A SessionConfig field (or CLI flag) is invalid; raised before anything loads."""


class ModelFileError(BmoeError):
    """The model file cannot be used: not a GGUF, truncated, refused by llama.cpp, or (with
    --moe-stream) a layout or architecture bmoe cannot stream. Raised while opening a session."""


class RequestError(BmoeError, ValueError):
    """A request was refused before any work: the session is unchanged and stays usable."""


class ContextOverflowError(RequestError):
    """The prompt (plus the tokens to generate) does not fit the context."""


class SessionClosedError(BmoeError):
    """The session was closed (or broke fatally) and cannot serve requests."""


class EngineFailure(BmoeError, RuntimeError):
    """The engine failed while the model ran (an expert read, the file changed under it, the
    streaming hook). The session turns it into its sticky StreamFailedError."""


class StreamFailedError(BmoeError):
    """Expert streaming failed (read error, file changed, bad route). Sticky: reopen the session."""
