"""decide / decide_batch commands of the session loop -> BMOE_DECIDE lines."""
from __future__ import annotations

from typing import Callable

from . import telemetry
from .decide.types import DecideRequest
from .protocol import Decide, DecideBatch
from .session import Session

OFF_MESSAGE = "decide is off in this session: start it with --decide"


def to_request(cmd: Decide) -> DecideRequest:
    f = cmd.fields
    return DecideRequest(
        id=cmd.id, prefix=f.get("prefix", ""), suffix=f.get("suffix", ""), choices=tuple(f["choices"]),
        reuse_prefix=f.get("reuse_prefix", True),
        abstain_below=None if f.get("abstain_below") is None else float(f["abstain_below"]),
    )


def serve_decide(session: Session, cmd: Decide | DecideBatch, emit: Callable[[str], None]) -> None:
    items = cmd.requests if isinstance(cmd, DecideBatch) else (cmd,)
    if session.decider is None:
        for item in items:
            emit(telemetry.line("DECIDE", {"id": item.id, "error": OFF_MESSAGE}))
        return
    requests = [to_request(i) for i in items]
    results = session.decide_many(requests) if isinstance(cmd, DecideBatch) else [session.decide(requests[0])]
    for r in results:
        emit(telemetry.line("DECIDE", r.to_json()))
