"""The tests' metric() reader cannot be misused: a sample that is not there fails the test instead
of reading 0, so an assert built on it always checks a real figure."""

from __future__ import annotations

import pytest

from bmoe.server.metrics import Metrics
from helpers.server import label_sets, metric


@pytest.fixture()
def text() -> str:
    m = Metrics(queue_depth=lambda: 2, stats=lambda: {})
    m.chat.labels("stop").inc(3)
    m.requests.labels("/v1/decide", "200").inc()
    m.cancelled.inc()
    return m.render().decode()


def test_reads_a_sample_by_name_and_labels(text) -> None:
    assert metric(text, "bmoe_cancelled_total") == 1
    assert metric(text, "bmoe_completion_tokens_total") == 0  # declared, counted nothing: a real 0
    assert metric(text, "bmoe_chat_completions_total", finish_reason="stop") == 3
    assert metric(text, "bmoe_http_requests_total", route="/v1/decide", status="200") == 1
    assert metric(text, "bmoe_queue_depth") == 2


@pytest.mark.parametrize(
    "name, labels",
    [
        ("bmoe_chat_completions_total", {}),  # a labelled counter without its labels
        ("bmoe_chat_completions_total", {"finish_reason": "length"}),  # a label set not counted yet
        ("bmoe_http_requests_total", {"route": "/v1/decide"}),  # only some of the labels
        ("bmoe_cancelled_total", {"route": "/v1/decide"}),  # labels an unlabelled counter does not have
        ("bmoe_cancelled", {}),  # the family name, not the sample's
        ("bmoe_no_such_thing_total", {}),
    ],
)
def test_a_missing_sample_fails_instead_of_reading_zero(text, name, labels) -> None:
    with pytest.raises(AssertionError, match="no sample"):
        metric(text, name, **labels)


def test_labels_inside_the_name_are_refused(text) -> None:
    with pytest.raises(TypeError, match="keywords"):
        metric(text, 'bmoe_chat_completions_total{finish_reason="stop"}')


def test_label_sets(text) -> None:
    assert label_sets(text, "bmoe_chat_completions_total") == [{"finish_reason": "stop"}]
    assert label_sets(text, "bmoe_decisions_total") == []  # declared, nothing counted
    with pytest.raises(AssertionError, match="declare no"):
        label_sets(text, "bmoe_decision_total")  # a misspelling cannot pass as "nothing counted"
