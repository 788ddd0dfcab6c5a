"""The structured request form: a question and option texts that bmoe renders itself.

A structured request (``question`` + ``options``, no ``choices``) becomes a plain one: the option
list rendered by its ``RenderRule`` is appended to ``suffix``, and the choices are the labels.
Rendering in a given order (``order[i]`` is the option shown at position ``i``) is what lets
``debias`` reorder the options; the labels stay in place, so a choice names a position.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import replace

from bmoe.decide.errors import DecideRequestError
from bmoe.decide.types import DecideRequest, RenderRule

DEFAULT_RULE = RenderRule()
DEFAULT_LABELS = tuple(string.ascii_uppercase)  # A..Z: 26 options at most without render.labels
CONTENT_FREE = "N/A"  # contextual calibration's question and option texts (Zhao et al. 2021)
DEBIAS_MODES = ("permute", "pride", "contextual")


def _quoted(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def labels_of(request: DecideRequest) -> tuple[str, ...]:
    """The labels of a structured request's options (checked: one per option)."""
    assert request.options is not None
    rule = request.render or DEFAULT_RULE
    return rule.labels if rule.labels is not None else DEFAULT_LABELS[: len(request.options)]


def check_structured(request: DecideRequest) -> None:
    """Refuse a structured form (or a debias request) that cannot be rendered or debiased; a plain
    request without any of its fields passes untouched."""
    structured = request.options is not None
    if request.debias is not None and request.debias not in DEBIAS_MODES:
        raise DecideRequestError(
            f'decide: "debias" is {_quoted(request.debias)}; give one of {", ".join(_quoted(m) for m in DEBIAS_MODES)}',
            field="debias",
        )
    if not structured:
        for name in ("question", "render", "debias"):
            if getattr(request, name) is not None:
                why = "so that bmoe can reorder the options" if name == "debias" else "to render"
                raise DecideRequestError(
                    f'decide: "{name}" needs the structured form: give "question" and "options" (the '
                    f'option texts) instead of "choices", {why}',
                    field=name,
                )
        return
    if request.choices:
        raise DecideRequestError(
            'decide: give "choices" or "options" (with "question"), not both: with "options" the choices '
            'are the labels bmoe renders',
            field="choices",
        )
    if request.question is None:
        raise DecideRequestError(
            'decide: "options" needs "question" (the text before the option list)', field="question"
        )
    options = request.options
    assert options is not None
    if not options:
        raise DecideRequestError('decide: "options" is empty; give at least one option text', field="options")
    if request.debias is not None and len(options) < 2:
        raise DecideRequestError(
            f'decide: "debias" needs at least 2 options to reorder, got {len(options)}', field="options"
        )
    if request.debias is not None and request.best_by != "sum":
        raise DecideRequestError(
            f'decide: "debias" works on the choices\' log-probs ("best_by": "sum"), not on '
            f'"best_by": {_quoted(request.best_by)}',
            field="best_by",
        )
    _check_rule(request.render or DEFAULT_RULE, len(options))


def _check_rule(rule: RenderRule, n: int) -> None:
    if "{options}" not in rule.template:
        raise DecideRequestError(
            'decide: "render.template" has no {options}; the option list would not be shown', field="render"
        )
    for key in ("{label}", "{text}"):
        if key not in rule.option:
            raise DecideRequestError(
                f'decide: "render.option" has no {key}; every option must show its label and its text', field="render"
            )
    if rule.labels is None:
        if n > len(DEFAULT_LABELS):
            raise DecideRequestError(
                f'decide: {n} options but the default labels are A..Z (26); give "render.labels"', field="render"
            )
        return
    if len(rule.labels) != n:
        raise DecideRequestError(
            f'decide: "render.labels" has {len(rule.labels)} labels for {n} options; give one label per option',
            field="render",
        )
    seen: dict[str, int] = {}
    for i, label in enumerate(rule.labels):
        if not label:
            raise DecideRequestError(f'decide: label {i} is empty; give every option a label', field="render")
        if label in seen:
            raise DecideRequestError(
                f'decide: labels {seen[label]} and {i} are both {_quoted(label)}; give each option its own label',
                field="render",
            )
        seen[label] = i


_BLOCK_KEYS = re.compile(r"\{(question|options|cue)\}")
_OPTION_KEYS = re.compile(r"\{(label|text)\}")


def _fill(pattern: re.Pattern[str], template: str, values: dict[str, str]) -> str:
    """``template`` with each placeholder of ``pattern`` replaced by its value, in one pass over
    the template: what is put in is never looked at again, so no text (a question holding
    "{options}", a label "{text}", any bytes at all) can be taken for a placeholder."""
    return pattern.sub(lambda m: values[m.group(1)], template)


def render_block(question: str, texts: Sequence[str], labels: Sequence[str], rule: RenderRule) -> str:
    """The question, the options (``texts[i]`` under ``labels[i]``) and the cue, by ``rule``.

    Placeholders are replaced as text (never ``str.format``, never through a marker), so braces
    in a text are text and a text is shown as it is."""
    lines = [_fill(_OPTION_KEYS, rule.option, {"label": label, "text": text}) for label, text in zip(labels, texts)]
    return _fill(
        _BLOCK_KEYS, rule.template, {"question": question, "options": rule.joiner.join(lines), "cue": rule.cue}
    )


def rendered(
    request: DecideRequest, order: Sequence[int] | None = None, *, content_free: bool = False, keep_abstain: bool = True
) -> DecideRequest:
    """The plain request a checked structured one stands for, its options shown in ``order``
    (``order[i]``: the option at position i; None: as given). ``content_free``: the question and
    every option text are ``CONTENT_FREE`` (contextual calibration's prompt)."""
    assert request.options is not None and request.question is not None
    labels = labels_of(request)
    rule = request.render or DEFAULT_RULE
    texts = list(request.options) if order is None else [request.options[k] for k in order]
    question = request.question
    if content_free:
        question, texts = CONTENT_FREE, [CONTENT_FREE] * len(texts)
    return replace(
        request,
        suffix=request.suffix + render_block(question, texts, labels, rule),
        choices=labels,
        question=None,
        options=None,
        render=None,
        debias=None,
        abstain_below=request.abstain_below if keep_abstain else None,
    )


def rotation(n: int, k: int) -> tuple[int, ...]:
    """The k-th cyclic permutation of n options: position i shows option (i + k) mod n."""
    return tuple((i + k) % n for i in range(n))
