"""The texts a constraint allows, when they are a finite set (constrain/choices.py): read off the
compiled grammar, so exactly what constrained generation may write; and the condition under
which a decision's scores show constrained greedy's text (``greedy_agrees``)."""

from __future__ import annotations

import math

import pytest

from bmoe.constrain import ConstraintError, choice_grammar, finite_texts, greedy_agrees
from bmoe.constrain.grammar import gbnf_grammar
from bmoe.constrain.schema import schema_grammar


def _obj(**props: dict) -> dict:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


@pytest.mark.parametrize(
    "schema,texts",
    [
        ({"enum": ["yes", "no", "unsure"]}, ('"no"', '"unsure"', '"yes"')),
        ({"enum": [1, 10, "1"]}, ('"1"', "1", "10")),
        ({"type": "boolean"}, ("false", "true")),
        ({"const": {"b": [1, 2], "a": None}}, ('{"b":[1,2],"a":null}',)),
        (
            _obj(label={"enum": ["a", "b"]}, kind={"const": "k"}),
            ('{"label":"a","kind":"k"}', '{"label":"b","kind":"k"}'),
        ),
        (_obj(answer={"type": "boolean"}), ('{"answer":false}', '{"answer":true}')),
        # the engine writes a newline in a string two ways (and \u000a in either case): all are texts
        ({"enum": ["a\nb"]}, ('"a\\nb"', '"a\\u000Ab"', '"a\\u000ab"')),
    ],
)
def test_finite_schemas_give_their_texts(schema, texts) -> None:
    assert finite_texts(schema_grammar(schema)) == tuple(sorted(texts))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string"},
        {"type": "integer"},
        {"type": "object", "properties": {"v": {"enum": [1, 2]}}},  # more properties may follow
        _obj(city={"type": "string"}),
        {"enum": list(range(300))},
    ],
)
def test_open_or_large_schemas_are_not_choices(schema) -> None:
    assert finite_texts(schema_grammar(schema), limit=256) is None


def test_objects_are_compact_json() -> None:
    """Compiled without free whitespace: an object of one free property is a finite set."""
    assert finite_texts(schema_grammar(_obj(ok={"type": "boolean"}))) == ('{"ok":false}', '{"ok":true}')


def test_guided_choice_texts_are_the_choices_exactly() -> None:
    choices = ["positive", "negative", 'a "quoted"\\ and\nnew line', "é"]
    field, gbnf = choice_grammar(guided_choice=choices) or ("", "")
    assert field == "guided_choice"
    assert finite_texts(gbnf_grammar(gbnf)) == tuple(sorted(choices))
    field, gbnf = choice_grammar(structured_outputs={"choice": ["x", "xy"]}) or ("", "")
    assert field == "structured_outputs.choice" and finite_texts(gbnf_grammar(gbnf)) == ("x", "xy")
    assert choice_grammar() is None


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"guided_choice": "yes"}, "guided_choice: must be a non-empty list of strings"),
        ({"guided_choice": ["a", ""]}, "guided_choice.1: must be a non-empty string"),
        ({"guided_choice": ["a", "a"]}, "guided_choice.1: repeats the value 'a'"),
        (
            {"guided_choice": ["a"], "structured_outputs": {"choice": ["a"]}},
            "structured_outputs: give guided_choice or",
        ),
        ({"structured_outputs": {}}, "structured_outputs: must hold 'choice'"),
        ({"structured_outputs": {"json": {}}}, "structured_outputs.json: is not supported here"),
        ({"guided_choice": ["x" * 2000]}, "guided_choice.0: is longer than 1024 bytes"),
    ],
)
def test_choice_refusals(kw, message) -> None:
    with pytest.raises(ConstraintError, match="^" + message.replace("(", r"\(")):
        choice_grammar(**kw)


L = math.log


@pytest.mark.parametrize(
    "texts,best,pieces,logps,agrees",
    [
        # first tokens differ: one token over 1/2 settles it
        (["yes", "no"], 0, [b"yes"], [L(0.6)], True),
        (["yes", "no"], 0, [b"yes"], [L(0.4)], False),  # a token outside the choices may beat it
        # a shared first token: each token up to the split must be over 1/2
        (["New York", "New Jersey"], 1, [b"New", b" Jersey"], [L(0.9), L(0.7)], True),
        (["New York", "New Jersey"], 1, [b"New", b" Jersey"], [L(0.9), L(0.45)], False),
        (["New York", "New Jersey"], 1, [b"New", b" Jersey"], [L(0.3), L(0.99)], False),
        # after the split nothing else counts: the grammar forces the rest
        (["Albany", "Buffalo"], 0, [b"Al", b"bany"], [L(0.8), L(0.01)], True),
        # a choice that another extends: greedy's end token was never scored
        (["a", "ab"], 0, [b"a"], [L(0.99)], False),
        (["a", "ab"], 1, [b"a", b"b"], [L(0.99), L(0.99)], True),
        # within the margin of 1/2: not shown
        (["yes", "no"], 0, [b"yes"], [L(0.5005)], False),
    ],
)
def test_greedy_agrees(texts, best, pieces, logps, agrees) -> None:
    assert greedy_agrees(texts, best, pieces, logps) is agrees
