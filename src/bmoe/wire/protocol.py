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
from dataclasses import dataclass, fields as dataclass_fields
from typing import Union

from bmoe.decide.types import DEFAULT_CUE, DEFAULT_JOINER, DEFAULT_OPTION, DEFAULT_TEMPLATE, DecideRequest, RenderRule
from bmoe.errors import RequestError
from bmoe import rules
from bmoe.rules import FieldError, Spec, check_fields
from bmoe.runtime.results import GENERATE_FIELDS, GenerateRequest


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


def decode_line(raw: bytes) -> str:
    """A request line's bytes as text; bytes that are not UTF-8 are refused, never replaced."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"request line is not valid UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start} ({e.reason})") from None


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
    fields: dict  # validated decide fields (see DECIDE_FIELDS)

    @property
    def request(self) -> DecideRequest:
        f = self.fields
        return DecideRequest(
            id=self.id, prefix=f.get("prefix", ""), suffix=f.get("suffix", ""), choices=tuple(f.get("choices", ())),
            reuse_prefix=f.get("reuse_prefix", True),
            abstain_below=None if f.get("abstain_below") is None else float(f["abstain_below"]),
            scoring=f.get("scoring", "first"), best_by=f.get("best_by", "sum"), unconditional=f.get("unconditional"),
            question=f.get("question"), options=None if f.get("options") is None else tuple(f["options"]),
            render=None if f.get("render") is None else render_rule(f["render"]), debias=f.get("debias"),
            images=tuple(f.get("images", ())),
        )


def render_rule(obj: dict) -> RenderRule:
    """A checked ``render`` object as a RenderRule (what it leaves out takes the defaults)."""
    labels = obj.get("labels")
    return RenderRule(template=obj.get("template", DEFAULT_TEMPLATE), option=obj.get("option", DEFAULT_OPTION),
                      joiner=obj.get("joiner", DEFAULT_JOINER), cue=obj.get("cue", DEFAULT_CUE),
                      labels=None if labels is None else tuple(labels))


def request_fields(request: DecideRequest) -> dict:
    """The decide object of ``request``, the inverse of ``Decide.request``: ``id``, ``prefix``,
    ``suffix``, then every field that differs from its default (``choices`` unless the request
    is in the structured form), so that ``parse_line`` of it gives ``request`` back."""
    out: dict = {"id": request.id, "prefix": request.prefix, "suffix": request.suffix}
    if request.choices or request.options is None:
        out["choices"] = list(request.choices)
    for f in dataclass_fields(DecideRequest):
        if f.name in out or f.name == "choices":
            continue
        value = getattr(request, f.name)
        if value == f.default:
            continue
        if f.name == "render":
            value = {r.name: list(v) if isinstance(v, tuple) else v
                     for r in dataclass_fields(RenderRule) if (v := getattr(value, r.name)) != r.default}
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


@dataclass(frozen=True, slots=True)
class DecideBatch:
    id: int
    requests: tuple[Decide, ...]


Command = Union[GenerateRequest, Cancel, Close, Stats, Decide, DecideBatch]

# the field rules and the table check are bmoe.rules'; a generate line's table is the session's own
# (GENERATE_FIELDS, next to GenerateRequest)
_INT, _BOOL, _STR, _PROB, _STR_LIST = rules.INT, rules.BOOL, rules.STR, rules.PROB, rules.STR_LIST

DECIDE_FIELDS: Spec = {
    # "choices" or "options" (with "question"): one of the two is required, checked by _check_decide
    "id": (_INT, False), "prefix": (_STR, False), "suffix": (_STR, False), "choices": (_STR_LIST, False),
    "reuse_prefix": (_BOOL, False), "abstain_below": (_PROB, False),
    # values checked by decide (a refusal of that request only): docs/decide.md "Scoring modes"
    "scoring": (_STR, False), "best_by": (_STR, False), "unconditional": (_STR, False),
    # the structured form and order debiasing: docs/decide.md "Order debiasing"
    "question": (_STR, False), "options": (_STR_LIST, False),
    "render": (rules.OBJECT, False), "debias": (_STR, False),
    # images (docs/decide.md "Images"): file paths or data: URLs, at the text's markers
    "images": (rules.IMAGES, False),
}
RENDER_FIELDS: Spec = {
    "template": (_STR, False), "option": (_STR, False), "joiner": (_STR, False), "cue": (_STR, False),
    "labels": (_STR_LIST, False),
}


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
    if "choices" not in fields and "options" not in fields:
        raise ProtocolError(f"{what}: missing field 'choices'", rid)  # or 'options' (docs/protocol.md)
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
            return (f"id {rid} is given to {', '.join(places[:-1])} and {places[-1]}; give each request its "
                    f"own id (or none: those answer as id 0, in the order of the requests)")
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
        raise ProtocolError(f"not valid JSON: an integer of more than {sys.get_int_max_str_digits()} digits, "
                            "more than Python reads") from None


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
        fields = _check(body, GENERATE_FIELDS, "generate", rid)
        if "images" in fields:
            fields["images"] = tuple(fields["images"])
        return GenerateRequest(**fields)
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
    raise ProtocolError(f"unknown cmd {cmd[:40]!r} (expected generate, cancel, close, stats, decide, decide_batch)", rid)
