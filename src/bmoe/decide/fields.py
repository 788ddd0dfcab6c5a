"""The decide request's field table, written once, and the one builder of a DecideRequest from
checked fields.

Every surface derives from ``DECIDE_TABLE``: the line protocol's checks (``bmoe.wire.protocol``),
the server's request body (``bmoe.server.schemas``) and the field table of docs/decide.md (a test
renders it and compares). ``DecideRequest`` (types.py) keeps the same names and defaults, and a
test holds it to the table.
"""

from __future__ import annotations

from typing import Any

from bmoe import rules
from bmoe.decide.types import DEFAULT_CUE, DEFAULT_JOINER, DEFAULT_OPTION, DEFAULT_TEMPLATE, DecideRequest, RenderRule
from bmoe.rules import Field, Table

RENDER_TABLE: Table = (
    Field(
        "template",
        rules.STR,
        DEFAULT_TEMPLATE,
        "the block; `{question}`, `{options}` and `{cue}` are replaced, and it must have `{options}`",
    ),
    Field("option", rules.STR, DEFAULT_OPTION, "one option; must have `{label}` and `{text}`"),
    Field("joiner", rules.STR, DEFAULT_JOINER, "between two options"),
    Field("cue", rules.STR, DEFAULT_CUE, "the answer cue, put where `{cue}` is"),
    Field(
        "labels",
        rules.STR_LIST,
        None,
        "one label per option, all different; the default runs to Z (26 options)",
        default_doc='`["A", "B", ...]`',
    ),
)

DECIDE_TABLE: Table = (
    Field("id", rules.INT, 0, "echoed in the answer"),
    Field(
        "prefix",
        rules.STR,
        "",
        "the part of the prompt worth keeping for the next request: instructions, task, history",
    ),
    Field("suffix", rules.STR, "", "the rest: what changes from one request to the next"),
    # required unless "options" is given (check_choices)
    Field("choices", rules.STR_LIST, (), "the labels to choose from", default_doc="required (or `options`)"),
    Field("reuse_prefix", rules.BOOL, True, "`false`: prefill this prompt whole and leave the kept state alone"),
    Field("abstain_below", rules.PROB, None, "when the best choice's probability is below it, answer `best: -1`"),
    # values checked by decide (a refusal of that request only): docs/decide.md "Scoring modes"
    Field(
        "scoring",
        rules.STR,
        "first",
        '`"first"`: each choice scored by its first token; `"full"`: by all its '
        "tokens ([Scoring modes](#scoring-modes))",
    ),
    Field(
        "best_by",
        rules.STR,
        "sum",
        'which score picks `best`: `"sum"`, and under `"full"` also `"mean"`, `"norm"`, `"uncond"`',
    ),
    Field(
        "unconditional",
        rules.STR,
        None,
        '`"full"` only: a neutral prompt (one user message, rendered like the '
        "prompt) after which the choices are scored too; with "
        '`best_by: "uncond"` and no `unconditional`, an empty user message',
    ),
    # the structured form and order debiasing: docs/decide.md "Order debiasing"
    Field(
        "question",
        rules.STR,
        None,
        "the structured form: the question; bmoe writes it and the option list "
        "after `suffix` ([Order debiasing](#order-debiasing))",
    ),
    Field(
        "options",
        rules.STR_LIST,
        None,
        "the structured form, instead of `choices`: the option texts; the choices are then their labels",
    ),
    Field(
        "render",
        rules.OBJECT,
        None,
        "the structured form: how the option list is written (`template`, `option`, `joiner`, `cue`, `labels`)",
        fields=RENDER_TABLE,
        default_doc="see below",
    ),
    Field(
        "debias",
        rules.STR,
        None,
        '`"permute"`, `"pride"` or `"contextual"`: take the model\'s preference for '
        "option positions out of the answer; needs the structured form",
    ),
    Field(
        "images",
        rules.IMAGES,
        (),
        "image file paths or base64 `data:` URLs, at the `<__media__>` markers of "
        "`prefix + suffix`, or in front of the prefix without one; needs `--mmproj` "
        "([Images](#images))",
    ),
)

MISSING_CHOICES = "missing field 'choices'"  # the refusal of a request with neither choices nor options


def lacks_choices(fields: dict) -> bool:
    """True when checked ``fields`` give neither ``choices`` nor ``options`` (one is required)."""
    return fields.get("choices") is None and fields.get("options") is None


def _tuple(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


def decide_request(fields: dict) -> DecideRequest:
    """The DecideRequest of checked decide ``fields`` (the protocol's line, the server's body; a
    field left out or null takes the table's default). Lists become tuples, ``render`` a RenderRule,
    ``abstain_below`` a float."""
    f: dict[str, Any] = rules.with_defaults(fields, DECIDE_TABLE)
    if f["render"] is not None:
        render: dict[str, Any] = {k: _tuple(v) for k, v in f["render"].items()}
        f["render"] = RenderRule(**render)
    if f["abstain_below"] is not None:
        f["abstain_below"] = float(f["abstain_below"])
    values: dict[str, Any] = {k: _tuple(v) for k, v in f.items()}
    return DecideRequest(**values)


def request_fields(request: DecideRequest) -> dict:
    """The decide object of ``request``, the inverse of ``decide_request``: ``id``, ``prefix``,
    ``suffix``, then every field that differs from its default (``choices`` unless the request
    is in the structured form)."""
    out: dict = {"id": request.id, "prefix": request.prefix, "suffix": request.suffix}
    if request.choices or request.options is None:
        out["choices"] = list(request.choices)
    for f in DECIDE_TABLE:
        value = getattr(request, f.name)
        if f.name in out or f.name == "choices" or value == f.default:
            continue
        if f.fields:
            value = {r.name: v for r in f.fields if (v := getattr(value, r.name)) != r.default}
            value = {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out
