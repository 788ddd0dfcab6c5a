"""One record for what an answer must be: from ``json_schema``, ``grammar`` or OpenAI's
``response_format``, whichever a request gives (at most one of them)."""

from __future__ import annotations

from dataclasses import dataclass

from bmoe.constrain.grammar import gbnf_grammar
from bmoe.constrain.schema import ConstraintError, schema_grammar

JSON_OBJECT = {"type": "object"}  # response_format json_object: any JSON object


@dataclass(frozen=True, slots=True)
class Constraint:
    """A compiled constraint: ``kind`` ("json_schema" | "grammar"), the request ``field`` that gave
    it (named in refusals found later, against the vocabulary), and the llguidance ``grammar``."""

    kind: str
    field: str
    grammar: str


def constraint_of(json_schema: object = None, grammar: object = None) -> Constraint | None:
    """The constraint of a request's ``json_schema`` and ``grammar`` fields (None: neither)."""
    if json_schema is not None and grammar is not None:
        raise ConstraintError("grammar", "give json_schema or grammar, not both")
    if json_schema is not None:
        return Constraint("json_schema", "json_schema", schema_grammar(json_schema, "json_schema"))
    if grammar is not None:
        return Constraint("grammar", "grammar", gbnf_grammar(grammar, "grammar"))
    return None


def from_response_format(fmt: object) -> dict | bool | None:
    """The JSON schema of OpenAI's ``response_format`` (checked and compiled once, so that a
    refusal names the field): ``text`` (None), ``json_object`` (any object) or ``json_schema``.
    The schema is enforced in full whether ``strict`` is true or not: bmoe never relaxes it."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise ConstraintError("response_format", "must be an object with a 'type'")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise ConstraintError("response_format.json_schema", "must be an object with a 'schema'")
        if not isinstance(spec.get("strict", False), bool):
            raise ConstraintError("response_format.json_schema.strict", "must be true or false")
        field = "response_format.json_schema.schema"
        schema_grammar(spec["schema"], field)
        return spec["schema"]
    raise ConstraintError("response_format.type", f"must be 'text', 'json_object' or 'json_schema', got {kind!r}")
