"""The rule each value of a setting or a request field keeps, written once.

A rule is a ``(text, test)`` pair: the text completes "must be ..." in a refusal, the test says
whether a value keeps it. The config's check (``bmoe.config.validate``), the session's check of a
``GenerateRequest`` (``bmoe.runtime.results.GENERATE_FIELDS``), the line protocol's field tables
(``bmoe.wire.protocol``) and the server's request bodies (their bounds) all read them from here,
so that a temperature the CLI accepts is one the protocol and the server accept too.

``check_fields`` applies a table of rules to one object: every field known, the required ones
present, each keeping its rule, every string valid Unicode.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeGuard

from bmoe.errors import RequestError

Rule = tuple[str, Callable[[object], bool]]  # ("a number in [0, 10]", test)
Spec = dict[str, tuple[Rule, bool]]  # field name -> (rule, required)

TEMPERATURE_MAX = 10.0  # sampling temperature: 0 (greedy) .. this
TOP_CAP = 20  # most alternatives a token or a scored position reports, as OpenAI's top_logprobs
BIAS_MAX = 100.0  # a logit bias is in [-BIAS_MAX, BIAS_MAX], as OpenAI's logit_bias
PENALTY_MAX = 2.0  # presence and frequency penalties are in [-PENALTY_MAX, PENALTY_MAX], as OpenAI's


def _int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


INT: Rule = ("an integer", _int)
POS_INT: Rule = ("an integer >= 1", lambda v: _int(v) and v >= 1)
BOOL: Rule = ("true or false", lambda v: isinstance(v, bool))
STR: Rule = ("a string", lambda v: isinstance(v, str))
NUM: Rule = ("a number", _num)
PROB: Rule = ("a number in [0, 1]", lambda v: _num(v) and 0.0 <= v <= 1.0)
TEMPERATURE: Rule = (f"a number in [0, {TEMPERATURE_MAX:g}]", lambda v: _num(v) and 0.0 <= v <= TEMPERATURE_MAX)
TOP_P: Rule = ("a number in (0, 1]", lambda v: _num(v) and 0.0 < v <= 1.0)
PENALTY: Rule = (f"a number in [{-PENALTY_MAX:g}, {PENALTY_MAX:g}]", lambda v: _num(v) and abs(v) <= PENALTY_MAX)
SEED: Rule = ("a non-negative integer", lambda v: _int(v) and v >= 0)
STR_LIST: Rule = ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v))
OBJECT: Rule = ("an object", lambda v: isinstance(v, dict))
SCHEMA: Rule = ("a JSON schema (an object, or true or false)", lambda v: isinstance(v, (dict, bool)))
IMAGES: Rule = (
    "a list of strings (image file paths or data: URLs)",
    lambda v: isinstance(v, (list, tuple)) and all(isinstance(s, (str, bytes)) and s for s in v),
)

# Where an image goes in a request's text (generate's prompt, decide's prefix and suffix): each
# marker takes the next image, in order. Text without a marker gets every image at its start.
IMAGE_MARKER = "<__media__>"


def place_images(text: str, n_images: int) -> str:
    """``text`` with its images placed: as it is where it holds a marker (or there are no images),
    else the ``n_images`` markers in front of it (the documented default)."""
    if n_images == 0 or IMAGE_MARKER in text:
        return text
    return IMAGE_MARKER * n_images + text


class FieldError(RequestError):
    """A request object broke its table's rules (the message names the field)."""


_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON's \uD800-\uDFFF escapes not paired into one character


def lone_surrogate(value: object) -> str | None:
    """Where ``value`` (a string or a list of strings) holds a lone surrogate, or None."""
    if isinstance(value, str):
        m = _SURROGATE.search(value)
        return None if m is None else f"a lone surrogate \\u{ord(m.group()):04x} at index {m.start()}"
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            where = lone_surrogate(v)
            if where is not None:
                return f"{where} of item {i}"
    return None


def check_fields(obj: dict, spec: Spec, what: str) -> dict:
    """``obj`` against its table ``spec``: a copy of it, or FieldError naming ``what`` and the field."""
    unknown = sorted(set(obj) - set(spec))
    if unknown:
        raise FieldError(f"{what}: unknown field(s) {', '.join(map(repr, unknown))}")
    for name, ((text, ok), required) in spec.items():
        if name not in obj:
            if required:
                raise FieldError(f"{what}: missing field {name!r}")
            continue
        if not ok(obj[name]):
            raise FieldError(f"{what}: field {name!r} must be {text}, got {json.dumps(obj[name])[:60]}")
        where = lone_surrogate(obj[name])
        if where is not None:
            raise FieldError(f"{what}: field {name!r} is not valid Unicode: {where}")
    return dict(obj)


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: object = _Required()  # a Field's default when the field must be given


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a request's table (docs/protocol.md "Request tables"): its name, its ``rule``
    (type and bound), its ``default`` (REQUIRED: none), what it means (``doc``, the docs' table),
    and for an object field the table of its own fields (``fields``). ``default_doc`` is the docs'
    default column where the default's JSON would not say it (a field required unless another is
    given)."""

    name: str
    rule: Rule
    default: object
    doc: str
    fields: tuple["Field", ...] = ()
    default_doc: str | None = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


Table = tuple[Field, ...]


def spec(table: Table) -> Spec:
    """The table as ``check_fields`` reads it."""
    return {f.name: (f.rule, f.required) for f in table}


def with_defaults(fields: dict, table: Table) -> dict:
    """Checked ``fields`` with every field the table has and they leave out (or give as null)
    at its default; an object field's own fields too."""
    out = {}
    for f in table:
        value = fields.get(f.name)
        if value is None:
            value = None if f.required else f.default
        elif f.fields:
            value = with_defaults(value, f.fields)
        out[f.name] = value
    return out


def _default_doc(f: Field) -> str:
    if f.default_doc is not None:
        return f.default_doc
    if f.required:
        return "required"
    if f.default is None:
        return "none"
    value = list(f.default) if isinstance(f.default, tuple) else f.default
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def markdown_table(table: Table) -> str:
    """The docs' table of a request's fields (docs/protocol.md, docs/decide.md): a test holds the
    docs to it."""
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for f in table:
        kind = f.rule[0].removeprefix("a ").removeprefix("an ")
        rows.append(f"| `{f.name}` | {kind} | {_default_doc(f)} | {f.doc} |")
    return "\n".join(rows)
