"""Answering protocol lines with one Session: the work of one batch, on an actor or in-process.

A row is one line of the session line protocol (docs/protocol.md): a decide object, with or
without ``"cmd":"decide"``, or a generate object with ``"cmd":"generate"``. It is parsed by the
same ``parse_line`` the ``--session`` loop uses, so it is accepted and refused as it would be
there. Each row gets one result object: the ``BMOE_DECIDE`` object (``decide_fields``), the
``BMOE_DONE`` object (``done_fields``) for a generation, ``{"id", "error"}`` for a row that was
refused, or ``{"id", "error", "failed": true}`` for one that failed in the engine (it may answer
when sent again; a refusal will not). A bad row never stops the others.

Decisions are grouped by prefix text (groups in the order of their first row, rows in input
order within a group) and each group goes through ``Session.decide_many``, so the kept prefix
state is hit and, with ``decide_batch`` > 1, a group's suffixes are prefilled together. Rows with
``"debias": "pride"`` are the exception: the session estimates their prior from the first such
rows it answers, so they are answered in input order (a run of them with the same prefix in one
call), and which rows form the prior does not depend on how the others are grouped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TypeGuard

from bmoe.decide.types import DecideRequest, DecideResult
from bmoe.errors import RequestError, SessionClosedError, StreamFailedError
from bmoe.session import GenerateRequest, Session
from bmoe.wire.protocol import Decide, ProtocolError, parse_line, request_fields
from bmoe.wire.records import decide_fields, done_fields

# A session that raised one of these cannot answer anything more: the caller must replace it.
STICKY = (StreamFailedError, SessionClosedError)


def as_command_line(line: str) -> str:
    """``line`` with ``"cmd":"decide"`` added when it is a JSON object without a ``cmd``; any
    other text is returned as it is (the parser then refuses it with its own message)."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return line
    if isinstance(obj, dict) and "cmd" not in obj:
        return json.dumps({"cmd": "decide", **obj}, ensure_ascii=False)
    return line


def decide_line(request: DecideRequest) -> str:
    """The protocol line of ``request`` (what a caller holding DecideRequests sends as a row)."""
    return json.dumps({"cmd": "decide", **request_fields(request)}, ensure_ascii=False)


def _parse(line: str) -> Decide | GenerateRequest | ProtocolError:
    """A Decide, a GenerateRequest, or a ProtocolError for anything else."""
    try:
        cmd = parse_line(as_command_line(line))
    except ProtocolError as e:
        return e
    if isinstance(cmd, (Decide, GenerateRequest)):
        return cmd
    name = type(cmd).__name__.lower().replace("decidebatch", "decide_batch")
    return ProtocolError(
        f"a row is one decide or generate request; {name} is not answered here "
        "(give a decide_batch's requests one per row)",
        getattr(cmd, "id", None),
    )


def prefix_key(line: str) -> str:
    """What rows are grouped and sorted by: a decision's prefix text, "" for any other row."""
    cmd = _parse(line)
    return cmd.fields.get("prefix", "") if isinstance(cmd, Decide) else ""


def _is_pride(cmd: object) -> TypeGuard[Decide]:
    return isinstance(cmd, Decide) and cmd.fields.get("debias") == "pride"


def is_pride(line: str) -> bool:
    """Whether ``line`` is a decision that asks for ``"debias": "pride"``, whose answer depends on
    the rows its session answered before it (docs/decide.md#order-debiasing)."""
    return _is_pride(_parse(line))


def order_key(line: str) -> tuple[int, str]:
    """What rows are sorted by before batching (a stable sort): the pride rows first, in input
    order, then the others by prefix, so a batch holds whole prefix groups."""
    cmd = _parse(line)
    if _is_pride(cmd):
        return (0, "")
    return (1, cmd.fields.get("prefix", "") if isinstance(cmd, Decide) else "")


def _error(rid: int | None, msg: str) -> dict:
    return {"id": rid, "error": msg}


def _internal(rid: int | None, e: Exception) -> dict:
    return {**_error(rid, f"internal error: {type(e).__name__}: {e}"), "failed": True}


def _decided(result: DecideResult) -> dict:
    """The BMOE_DECIDE object, marked ``failed`` when the engine, not the request, was at fault."""
    out = decide_fields(result)
    return {**out, "failed": True} if result.error is not None and not result.refused else out


def answer_lines(session: Session, lines: Sequence[str]) -> list[dict]:
    """One result object per line of ``lines``, in the same order. Raises only a sticky session
    error (``STICKY``): then nothing of this batch is answered and the session must be replaced."""
    out: list[dict | None] = [None] * len(lines)
    groups: dict[str, list[tuple[int, Decide]]] = {}
    calls: list[list[tuple[int, Decide]]] = []  # the decide_many calls, in order
    pride: list[tuple[int, Decide]] | None = None  # the call the last pride row went to
    generates: list[tuple[int, GenerateRequest]] = []
    for i, line in enumerate(lines):
        cmd = _parse(line)
        if isinstance(cmd, ProtocolError):
            out[i] = _error(cmd.request_id, str(cmd))
        elif _is_pride(cmd):  # in input order: a pride row joins the last pride call only if it has its prefix
            prefix = cmd.fields.get("prefix", "")
            if pride is None or pride[0][1].fields.get("prefix", "") != prefix:
                pride = []
                calls.append(pride)
            pride.append((i, cmd))
        elif isinstance(cmd, Decide):
            prefix = cmd.fields.get("prefix", "")
            if prefix not in groups:
                groups[prefix] = []
                calls.append(groups[prefix])
            groups[prefix].append((i, cmd))
        else:
            generates.append((i, cmd))
    for group in calls:
        try:
            results = session.decide_many([cmd.request for _, cmd in group])
            answers = [_decided(r) for r in results]
        except STICKY:
            raise
        except RequestError as e:  # the whole call refused (decide off): every row of it says why
            answers = [_error(cmd.id, str(e)) for _, cmd in group]
        except Exception as e:  # a bug must not lose the other rows
            answers = [_internal(cmd.id, e) for _, cmd in group]
        for (i, _), answer in zip(group, answers, strict=True):
            out[i] = answer
    for i, req in generates:
        try:
            out[i] = done_fields(session.generate(req))
        except STICKY:
            raise
        except RequestError as e:
            out[i] = _error(req.id, str(e))
        except Exception as e:
            out[i] = _internal(req.id, e)
    assert all(o is not None for o in out)
    return out  # type: ignore[return-value]
