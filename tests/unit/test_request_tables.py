"""One table per request (#40.1): the records, the line protocol, the server's body and the docs
all follow DECIDE_TABLE / GENERATE_TABLE, so a field added to one surface and not the others fails
here."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bmoe import rules
from bmoe.decide.fields import DECIDE_TABLE, RENDER_TABLE, decide_request, request_fields
from bmoe.decide.types import DecideRequest, RenderRule
from bmoe.runtime.results import GENERATE_TABLE, GenerateRequest, generate_request
from bmoe.wire import protocol

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _defaults(record: type) -> dict:
    return {
        f.name: f.default if f.default is not dataclasses.MISSING else rules.REQUIRED
        for f in dataclasses.fields(record)
    }


@pytest.mark.parametrize(
    "record, table, required_anyway, python_only",
    [
        (
            DecideRequest,
            DECIDE_TABLE,
            {"id", "prefix", "suffix", "choices"},
            {"history"},
        ),  # the record asks for them by name
        (RenderRule, RENDER_TABLE, set(), set()),
        (
            GenerateRequest,
            GENERATE_TABLE,
            set(),
            {
                "keep_logits",
                "top_logprobs",
                "logit_bias",
                "tools",
                "tool_choice",
                "parallel_tool_calls",
                "tool_call_id",
                "reasoning_effort",
                "template_vars",
            },
        ),  # Python and the server only
    ],
)
def test_record_has_the_tables_fields_and_defaults(record, table, required_anyway, python_only):
    want = {f.name: f.default for f in table}
    have = {k: v for k, v in _defaults(record).items() if k not in python_only}
    assert set(have) == set(want), "the record and its table name different fields"
    for name, default in want.items():
        if name not in required_anyway:
            assert have[name] == default, name


@pytest.mark.parametrize(
    "table, page",
    [
        (DECIDE_TABLE, "decide.md"),
        (RENDER_TABLE, "decide.md"),
        (GENERATE_TABLE, "protocol.md"),
    ],
)
def test_docs_show_the_table(table, page):
    rendered = rules.markdown_table(table)
    assert rendered in (DOCS / page).read_text(), f"docs/{page}'s table is not the code's; it is now:\n{rendered}"


def test_protocol_checks_are_the_tables():
    assert protocol.DECIDE_FIELDS == rules.spec(DECIDE_TABLE)
    assert protocol.RENDER_FIELDS == rules.spec(RENDER_TABLE)
    assert protocol.GENERATE_FIELDS == rules.spec(GENERATE_TABLE)


def test_server_body_has_the_tables_fields():
    pytest.importorskip("fastapi")
    from bmoe.server.schemas import DecideBody, RenderBody

    assert set(DecideBody.model_fields) == {f.name for f in DECIDE_TABLE}
    assert set(RenderBody.model_fields) == {f.name for f in RENDER_TABLE}
    for f in RENDER_TABLE:
        assert RenderBody.model_fields[f.name].default == f.default, f.name


def test_one_builder_for_protocol_server_and_python():
    line = {
        "cmd": "decide",
        "id": 3,
        "prefix": "P",
        "suffix": "S",
        "question": "q?",
        "options": ["x", "y"],
        "render": {"labels": ["1", "2"], "joiner": " "},
        "abstain_below": 1,
        "debias": "permute",
    }
    parsed = protocol.parse_line(json.dumps(line)).request
    want = DecideRequest(
        id=3,
        prefix="P",
        suffix="S",
        choices=(),
        question="q?",
        options=("x", "y"),
        render=RenderRule(labels=("1", "2"), joiner=" "),
        abstain_below=1.0,
        debias="permute",
    )
    assert parsed == want and isinstance(parsed.abstain_below, float)
    assert decide_request({k: v for k, v in line.items() if k != "cmd"}) == want
    assert decide_request(request_fields(want)) == want
    assert (
        protocol.parse_line('{"cmd":"generate","prompt":"hi","images":["a.png"]}')
        == generate_request({"prompt": "hi", "images": ["a.png"]})
        == GenerateRequest(prompt="hi", images=("a.png",))
    )


def test_server_builds_with_the_same_function():
    pytest.importorskip("fastapi")
    from bmoe.server.decide_route import to_request
    from bmoe.server.schemas import DecideBody

    body = {
        "id": 3,
        "prefix": "P",
        "suffix": "S",
        "question": "q?",
        "options": ["x", "y"],
        "render": {"labels": ["1", "2"], "joiner": " "},
        "abstain_below": 1.0,
        "debias": "permute",
    }
    assert to_request(DecideBody.model_validate(body)) == decide_request(body)
    assert to_request(DecideBody.model_validate({"choices": ["a"]})) == DecideRequest(
        id=0, prefix="", suffix="", choices=("a",)
    )


def test_server_refuses_null_where_the_protocol_does():
    """render's texts have defaults, not none: null is refused on both surfaces (the server took it
    as 'the default' before the body was derived from the table)."""
    pytest.importorskip("fastapi")
    from pydantic import ValidationError

    from bmoe.server.schemas import DecideBody

    body = {"question": "q", "options": ["a", "b"], "render": {"template": None}}
    with pytest.raises(ValidationError) as e:
        DecideBody.model_validate(body)
    assert e.value.errors()[0]["loc"] == ("render", "template")
    with pytest.raises(protocol.ProtocolError, match="field 'template' must be a string, got null"):
        protocol.parse_line(json.dumps({"cmd": "decide", **body}))
