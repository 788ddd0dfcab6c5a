"""Exception types of decide: one per failure class, each message something a user can act on.

A ``DecideRefusal`` is raised before anything is prefilled, so the session and the kept prefix
state are exactly as they were. A ``DecideBackendError`` happened while the model ran: the kept
prefix state is still valid, but the sequence holds whatever the failed call left there.
"""

from __future__ import annotations

from bmoe.errors import BmoeError, RequestError


class DecideRefusal(RequestError):
    """A request decide will not run; nothing was touched."""


class DecideRequestError(DecideRefusal):
    """A request field is missing, of the wrong type or out of range; ``field`` names it."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class NoSideSequenceError(DecideRefusal):
    """Full scoring needs side sequences to score the choices on, and the session has none."""


class ChoiceTooLongError(DecideRefusal):
    """A choice's tokens do not fit in the context after the prompt."""


class NoChoicesError(DecideRefusal):
    """The choice list is empty."""


class EmptyChoiceError(DecideRefusal):
    """A choice tokenizes to no tokens, so it has no first token to score."""


class ChoiceCollisionError(DecideRefusal):
    """Two choices start with the same token, so their scores would be one number."""


class EmptyPromptError(DecideRefusal):
    """The rendered prompt has no tokens, so there is no position to read logits at."""


class PromptTooLongError(DecideRefusal):
    """The rendered prompt does not fit in the context."""


class DecideCancelled(RequestError):
    """The request was cancelled (its client left, or ``Session.cancel()``) before this decision
    ran, or between the ubatches of its batch; nothing of it is answered."""


class DecideBackendError(BmoeError):
    """The backend failed (or broke its contract) while the decision ran."""
