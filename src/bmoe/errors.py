"""Exception types, one per failure class. Each message names what was wrong."""
from __future__ import annotations


class BmoeError(Exception):
    """Base of every error bmoe raises on purpose."""


class ConfigError(BmoeError, ValueError):
    """A SessionConfig field (or CLI flag) is invalid; raised before anything loads."""


class RequestError(BmoeError, ValueError):
    """A request was refused before any work: the session is unchanged and stays usable."""


class ContextOverflowError(RequestError):
    """The prompt (plus the tokens to generate) does not fit the context."""


class SessionClosedError(BmoeError):
    """The session was closed (or broke fatally) and cannot serve requests."""


class StreamFailedError(BmoeError):
    """Expert streaming failed (read error, file changed, bad route). Sticky: reopen the session."""
