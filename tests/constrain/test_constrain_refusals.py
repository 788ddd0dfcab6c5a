"""Schemas and grammars bmoe cannot enforce exactly are refused by name (#36 "Bad input"), before
any model is involved; what it can enforce compiles."""

from __future__ import annotations

import pytest

from bmoe.constrain import MAX_ENUM, ConstraintError, constraint_of, from_response_format

GOOD_SCHEMAS = [
    {"enum": ["yes", "no", "unsure"]},
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1, "maxItems": 3},
    {"type": "string", "pattern": "^[a-z]{2,5}$", "title": "annotations are fine", "description": "x"},
    {"$defs": {"s": {"type": "string"}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/s"}}},
    {"anyOf": [{"type": "number"}, {"type": "null"}]},
    True,
]


@pytest.mark.parametrize("schema", GOOD_SCHEMAS)
def test_enforceable_schemas_compile(schema) -> None:
    c = constraint_of(json_schema=schema)
    assert c is not None and c.kind == "json_schema" and c.grammar


BAD = [
    (
        {"type": "array", "uniqueItems": True},
        "json_schema: keyword 'uniqueItems' at / is not supported (bmoe would not enforce it, so it refuses it)",
    ),
    (
        {"properties": {"a": {"not": {"type": "string"}}}},
        "json_schema: keyword 'not' at /properties/a is not supported (bmoe would not enforce it, so it refuses it)",
    ),
    ({"type": "foo"}, "json_schema: Invalid type: foo"),
    (
        {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
        "json_schema: recursive $ref '#/$defs/a' at /$defs/a (a schema that contains itself) is not supported",
    ),
    (
        {"type": "object", "properties": {"child": {"$ref": "#"}}},
        "json_schema: recursive $ref '#' at /properties/child (a schema that contains itself) is not supported",
    ),
    ({"properties": {"a": {"$ref": "#/$defs/nope"}}}, "json_schema: $ref '#/$defs/nope' points to nothing"),
    (
        {"enum": list(range(10_000))},
        f"json_schema: enum at / has 10000 values, more than the {MAX_ENUM} one request may hold",
    ),
    (
        {"type": "integer", "minimum": 5, "maximum": 2},
        "json_schema: Unsatisfiable schema: minimum (5) is greater than maximum (2)",
    ),
    ([1, 2], "json_schema: must be a JSON schema (an object or true/false), got list"),
    ({"type": "string", "format": "shoe-size"}, "json_schema: Unknown format: shoe-size"),
]


@pytest.mark.parametrize("schema,message", BAD)
def test_bad_schema_is_refused_by_name(schema, message: str) -> None:
    with pytest.raises(ConstraintError) as e:
        constraint_of(json_schema=schema)
    assert str(e.value) == message and e.value.field == "json_schema"


BAD_GRAMMARS = [
    ('root ::= "yes', "grammar: does not parse as GBNF: Unexpected end of input at line 1, 'root ::= \"yes' ^ ''"),
    ("root ::= answer", "grammar: does not parse as GBNF: Rule 'answer' not found"),
    ('answer ::= "a"', "grammar: does not parse as GBNF: No 'root' rule found"),
    ('root ::= x\nx ::= x "a"', "grammar: accepts no text at all (its root rule never ends)"),
    ("", "grammar: must be a non-empty GBNF grammar (a string with a root rule)"),
]


@pytest.mark.parametrize("grammar,message", BAD_GRAMMARS)
def test_bad_grammar_is_refused_by_name(grammar: str, message: str) -> None:
    with pytest.raises(ConstraintError) as e:
        constraint_of(grammar=grammar)
    assert str(e.value) == message


def test_good_grammar_and_one_constraint_at_most() -> None:
    assert constraint_of(grammar='root ::= "yes" | "no"') is not None
    assert constraint_of() is None
    with pytest.raises(ConstraintError, match="^grammar: give json_schema or grammar, not both$"):
        constraint_of(json_schema=True, grammar='root ::= "a"')


def test_response_format() -> None:
    assert from_response_format(None) is None and from_response_format({"type": "text"}) is None
    assert from_response_format({"type": "json_object"}) == {"type": "object"}
    schema = {"enum": ["a", "b"]}
    assert (
        from_response_format({"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": schema}})
        == schema
    )
    cases = [
        ({"type": "xml"}, "response_format.type: must be 'text', 'json_object' or 'json_schema', got 'xml'"),
        ({"type": "json_schema"}, "response_format.json_schema: must be an object with a 'schema'"),
        (
            {"type": "json_schema", "json_schema": {"schema": {"uniqueItems": True}}},
            "response_format.json_schema.schema: keyword 'uniqueItems' at / is not supported (bmoe would not enforce it, so it refuses it)",
        ),
    ]
    for fmt, message in cases:
        with pytest.raises(ConstraintError) as e:
            from_response_format(fmt)
        assert str(e.value) == message
