"""The session line protocol: one JSON object per stdin line -> a typed command.

Every refusal is a ProtocolError whose message names what was wrong (and the request id
when one could be read), so the loop can answer BMOE_ERROR {"fatal":false} and go on.
A line is bytes: at most MAX_LINE_BYTES of them (decode_line refuses what is not UTF-8),
then one JSON object whose fields are checked against its command's table (one rule for
every command: a field not in the table is refused).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Protocol, TextIO, Union

from bmoe import rules
from bmoe.decide.fields import DECIDE_TABLE, MISSING_CHOICES, RENDER_TABLE, decide_request, lacks_choices
from bmoe.decide.fields import request_fields as request_fields
from bmoe.decide.types import DecideRequest
from bmoe.errors import RequestError
from bmoe.rules import FieldError, Spec, check_fields
from bmoe.runtime.results import GENERATE_TABLE, GenerateRequest, generate_request


class ProtocolError(RequestError):
    def __init__(self, msg: str, request_id: int | None = None) -> None:
        super().__init__(msg)
        self.request_id = request_id


# The longest request line, in bytes, not counting its newline. 1 MiB holds a prompt that fills
# a 128k-token context in any text (English is ~4 bytes a token; CJK escaped as \uXXXX is 6
# bytes a character, about one token), far past the contexts a CPU edge session runs, and it
# bounds what one line can cost before its refusal: reading it, JSON, and tokenizing a prompt
# that cannot fit (linear in the text whatever it holds, bmoe.llama.special_cuts: about 2.5 s for
# 1 MiB of special tokens between short texts on a 2-core machine, the slowest text measured).
# A fixed number, so that a client knows it without asking the session.
MAX_LINE_BYTES = 1 << 20


def line_too_long() -> ProtocolError:
    return ProtocolError(f"request line is longer than the limit of {MAX_LINE_BYTES} bytes (1 MiB); it was skipped")


SKIP_CHUNK = 1 << 16  # the rest of an over-long line is read and dropped this many bytes at a time


class LineSource(Protocol):
    """What read_lines reads: anything with ``readline(size)`` (a file, stdin, a wrapper)."""

    def readline(self, size: int = -1, /) -> bytes | str: ...


def read_lines(stream: TextIO | BinaryIO | LineSource) -> Iterator[bytes | None]:
    """Each line's bytes without its newline, or None for a line over MAX_LINE_BYTES (of which
    no more than MAX_LINE_BYTES + SKIP_CHUNK bytes are held): the one reader of request lines
    (the --session loop, bmoe-batch's and bmoe-eval's data files). Reads a text stream's bytes
    where it has them (stdin); one without (io.StringIO) is read as text and encoded back."""
    src = getattr(stream, "buffer", stream)
    while True:
        chunk = src.readline(MAX_LINE_BYTES + 2)  # a line at the limit, with its "\r\n"
        if not chunk:
            return
        nl: Any = "\n" if isinstance(chunk, str) else b"\n"  # the stream's own kind: text or bytes
        if not chunk.endswith(nl) and len(chunk) > MAX_LINE_BYTES + 1:
            yield None
            while True:
                rest = src.readline(SKIP_CHUNK)
                if not rest or rest.endswith(nl):
                    break
            continue
        chunk = chunk.removesuffix(nl)
        raw = chunk.encode("utf-8", "surrogatepass") if isinstance(chunk, str) else bytes(chunk)
        limit = MAX_LINE_BYTES + (1 if raw.endswith(b"\r") else 0)  # a "\r" before the newline is not counted
        yield raw if len(raw) <= limit else None


def decode_line(raw: bytes) -> str:
    """A request line's bytes as text; bytes that are not UTF-8 are refused, never replaced."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(
            f"request line is not valid UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start} ({e.reason})"
        ) from None


@dataclass(frozen=True, slots=True)
class Cancel:
    id: int | None = None  # None: the oldest unfinished generate read before the cancel


@dataclass(frozen=True, slots=True)
class Close:
    pass


@dataclass(frozen=True, slots=True)
class Stats:
    id: int = 0


@dataclass(frozen=True, slots=True)
class Decide:
    id: int
    fields: dict  # checked decide fields (DECIDE_TABLE)

    @property
    def request(self) -> DecideRequest:
        return decide_request(self.fields)


@dataclass(frozen=True, slots=True)
class DecideBatch:
    id: int
    requests: tuple[Decide, ...]


Command = Union[GenerateRequest, Cancel, Close, Stats, Decide, DecideBatch]

# the field rules and the table check are bmoe.rules'; each request's table is its record's own
# (bmoe.decide.fields.DECIDE_TABLE, bmoe.runtime.results.GENERATE_TABLE)
_INT = rules.INT
DECIDE_FIELDS: Spec = rules.spec(DECIDE_TABLE)
RENDER_FIELDS: Spec = rules.spec(RENDER_TABLE)
GENERATE_FIELDS: Spec = rules.spec(GENERATE_TABLE)


ID_ONLY: Spec = {"id": (_INT, False)}  # stats, cancel, close
DECIDE_BATCH_FIELDS: Spec = {
    "id": (_INT, False),
    "requests": (("a list of decide objects", lambda v: isinstance(v, list) and len(v) > 0), True),
}


def _check(obj: dict, spec: Spec, what: str, rid: int | None) -> dict:
    """``obj`` (the request without its "cmd") against its command's table (``bmoe.rules``)."""
    try:
        return check_fields(obj, spec, what)
    except FieldError as e:
        raise ProtocolError(str(e), rid) from None


def _check_decide(obj: dict, what: str, rid: int | None) -> dict:
    """A decide request's fields: the table, the render object's own table, and choices or options."""
    fields = _check(obj, DECIDE_FIELDS, what, rid)
    if "render" in fields:
        fields["render"] = _check(fields["render"], RENDER_FIELDS, f"{what}: field 'render'", rid)
    if lacks_choices(fields):
        raise ProtocolError(f"{what}: {MISSING_CHOICES}", rid)  # or 'options' (docs/protocol.md)
    return fields


def repeated_id(ids: list[int], where: str = "requests[{}]") -> str | None:
    """Why a batch's ids cannot tell its answers apart, or None: an id other than 0 given to more
    than one request (0 is the id of a request that gives none; any number may have it, and
    their answers are told apart by their order). Names the first id repeated and where it is
    (``where`` formats a request's position)."""
    seen: dict[int, list[int]] = {}
    for i, rid in enumerate(ids):
        if rid != 0:
            seen.setdefault(rid, []).append(i)
    for rid, at in seen.items():
        if len(at) > 1:
            places = [where.format(i) for i in at]
            return (
                f"id {rid} is given to {', '.join(places[:-1])} and {places[-1]}; give each request its "
                f"own id (or none: those answer as id 0, in the order of the requests)"
            )
    return None


def _request_id(obj: dict) -> int | None:
    rid = obj.get("id")
    return rid if _INT[1](rid) else None


def decide_object(obj: dict) -> Decide:
    """A decide request already parsed from JSON (its fields, ``"cmd"`` left out), checked as
    ``parse_line`` checks a decide line; ProtocolError otherwise."""
    rid = _request_id(obj)
    return Decide(id=rid or 0, fields=_check_decide(obj, "decide", rid))


def read_json(text: str) -> object:
    """``json.loads``, its refusals in words a client can act on: ProtocolError ``not valid JSON: ...``."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ProtocolError(f"not valid JSON: {e}") from None
    except ValueError:  # the one other ValueError json.loads raises: an integer over Python's digit limit
        raise ProtocolError(
            f"not valid JSON: an integer of more than {sys.get_int_max_str_digits()} digits, more than Python reads"
        ) from None


def parse_line(line: str) -> Command:
    try:
        obj = read_json(line)
    except ProtocolError as e:
        raise ProtocolError(f"request is {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"request must be a JSON object, got {type(obj).__name__}")
    rid = _request_id(obj)
    cmd = obj.get("cmd")
    if cmd is None:
        raise ProtocolError("request has no 'cmd' field", rid)
    if not isinstance(cmd, str):
        raise ProtocolError(f"field 'cmd' must be a string, got {json.dumps(cmd)[:60]}", rid)
    body = {k: v for k, v in obj.items() if k != "cmd"}
    if cmd == "generate":
        return generate_request(_check(body, GENERATE_FIELDS, "generate", rid))
    if cmd == "cancel":
        _check(body, ID_ONLY, "cancel", rid)
        return Cancel(id=rid)
    if cmd == "close":
        _check(body, ID_ONLY, "close", rid)
        return Close()
    if cmd == "stats":
        _check(body, ID_ONLY, "stats", rid)
        return Stats(id=rid or 0)
    if cmd == "decide":
        return decide_object(body)
    if cmd == "decide_batch":
        _check(body, DECIDE_BATCH_FIELDS, "decide_batch", rid)
        items = []
        for i, r in enumerate(obj["requests"]):
            if not isinstance(r, dict):
                raise ProtocolError(f"decide_batch: requests[{i}] must be an object", rid)
            items.append(Decide(id=_request_id(r) or 0, fields=_check_decide(r, f"decide_batch: requests[{i}]", rid)))
        repeated = repeated_id([item.id for item in items])
        if repeated is not None:
            raise ProtocolError(f"decide_batch: {repeated}", rid)
        return DecideBatch(id=rid or 0, requests=tuple(items))
    raise ProtocolError(
        f"unknown cmd {cmd[:40]!r} (expected generate, cancel, close, stats, decide, decide_batch)", rid
    )
