"""Order debiasing and the structured form over a scripted runner (no model).

The runner answers a plain decision from the option list rendered in its suffix: the label at
position i gets the probability ``BIAS[i] * WEIGHT[text]`` (the rest of the vocabulary takes the
remainder), so a position preference and a content preference are both known, and every figure
below is worked out by hand from them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import replace

import pytest

from bmoe.decide.debias import DebiasState
from bmoe.decide.errors import DecideRefusal, DecideRequestError
from bmoe.decide.option_list import render_block
from bmoe.decide.service import DecideService
from bmoe.decide.types import ChoiceScores, DecideRequest, DecideResult, RenderRule
from bmoe.wire.protocol import ProtocolError, parse_line
from bmoe.wire.records import decide_fields

BIAS = [0.6, 0.2, 0.1]  # position A is preferred three times over B
WEIGHT = {"x": 0.3, "y": 0.6, "z": 0.5, "N/A": 0.4}
LINE = re.compile(r"^(\w+)\) (.*)$", re.M)


class Runner:
    """Answers plain requests from their rendered option lines; records every batch it got."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[list[DecideRequest]] = []
        self.fail_on = fail_on  # a suffix fragment whose decision fails

    def __call__(self, requests: Sequence[DecideRequest]) -> list[DecideResult]:
        self.calls.append(list(requests))
        out = []
        for r in requests:
            if self.fail_on is not None and self.fail_on in r.suffix:
                out.append(
                    DecideResult.failed(
                        r.id, "decide: the backend failed while running the prompt: boom", RuntimeError("boom")
                    )
                )
                continue
            texts = [t for _, t in LINE.findall(r.suffix)]
            assert [label for label, _ in LINE.findall(r.suffix)] == list(r.choices)
            logp = tuple(math.log(BIAS[i] * WEIGHT[t]) for i, t in enumerate(texts))
            best = max(range(len(logp)), key=logp.__getitem__)
            out.append(
                DecideResult(
                    id=r.id,
                    scores=ChoiceScores(
                        choice_logp=logp, best=best, p_outside=1 - sum(math.exp(v) for v in logp), abstained=False
                    ),
                    n_tokens=10,
                    prefill_s=0.5,
                )
            )
        return out

    @property
    def decisions(self) -> int:
        return sum(len(c) for c in self.calls)


class RunnerDecider:
    """A decider whose plain decisions a ``Runner`` answers instead of a model."""

    def __init__(self, run: Runner) -> None:
        self.run = run

    def answer(self, jobs: Sequence[DecideRequest], stop: object = None) -> list[DecideResult]:
        return self.run(jobs)


def debiased(run: Runner, requests: Sequence[DecideRequest], state: DebiasState) -> list[DecideResult]:
    """``requests`` answered by ``DecideService.answer`` (too much work, ``expand``, ``combine``)
    around a Runner's decider, with ``state`` as its debias state."""
    svc = DecideService(RunnerDecider(run))  # type: ignore[arg-type]
    svc.debias = state
    return svc.answer(requests)


def ask(options: Sequence[str], debias: str | None = None, **kw) -> DecideRequest:
    fields = {"id": 1, "prefix": "P ", "suffix": "", "choices": (), "question": "Q", **kw}
    return DecideRequest(options=tuple(options), debias=debias, **fields)


def test_the_option_list_is_rendered_by_the_rule_and_braces_in_a_text_stay_text() -> None:
    assert render_block("Q?", ["x", "y"], ["A", "B"], RenderRule()) == "Q?\nA) x\nB) y\nAnswer with the letter."
    rule = RenderRule(
        template=" {question} Options: {options}. {cue}",
        joiner=" ",
        option="({label}) {text}",
        cue="Say the number.",
        labels=("1", "2"),
    )
    assert (
        render_block("Which?", ["{cue}", "{label}"], ["1", "2"], rule)
        == " Which? Options: (1) {cue} (2) {label}. Say the number."
    )


@pytest.mark.parametrize("m", ["\0q", "\0o", "\0c", "{question}", "{options}", "{cue}", "{label}", "{text}"])
def test_no_text_is_taken_for_a_placeholder(m: str) -> None:
    """Whatever a question, an option, a label, the cue or the joiner holds (NUL bytes, the names
    of placeholders), it is shown as it is; so is the template's own text around them."""
    own = m if m.startswith("\0") else "\0"  # a placeholder written in the template is one
    rule = RenderRule(
        template=f"[{own}] {{question}} | {{options}} | {{cue}}",
        option=f"{{label}}={{text}}{own}",
        joiner=f",{m},",
        cue=f"cue{m}",
        labels=(f"A{m}", "B"),
    )
    got = render_block(f"q{m}?", [f"x{m}", "y"], [f"A{m}", "B"], rule)
    assert got == f"[{own}] q{m}? | A{m}=x{m}{own},{m},B=y{own} | cue{m}"


def test_structured_form_without_debias_is_the_plain_decision_it_renders_to() -> None:
    run = Runner()
    [res] = debiased(run, [ask(["x", "y"])], DebiasState())
    [[sent]] = run.calls
    assert (sent.prefix, sent.suffix, sent.choices) == ("P ", "Q\nA) x\nB) y\nAnswer with the letter.", ("A", "B"))
    assert res.debias is None and res.scores is not None and res.scores.best == 0


def test_permute_averages_each_option_over_its_positions() -> None:
    run = Runner()
    [res] = debiased(run, [ask(["x", "y"], "permute")], DebiasState())
    # Shown x, y: 0.18, 0.12 -> 0.6, 0.4. Shown y, x: 0.36, 0.06 -> 6/7, 1/7.
    # x: (0.6 + 1/7) / 2; y: (0.4 + 6/7) / 2.
    assert res.debias is not None and res.scores is not None
    assert res.debias.debiased_p == pytest.approx(((0.6 + 1 / 7) / 2, (0.4 + 6 / 7) / 2), abs=1e-12)
    assert (res.scores.best, res.debias.best_raw) == (1, 0)  # raw says A (x), debiased says y
    assert res.scores.choice_logp == pytest.approx((math.log(0.18), math.log(0.12)))  # raw: the given order
    assert [r.suffix for r in run.calls[0]] == [
        "Q\nA) x\nB) y\nAnswer with the letter.",
        "Q\nA) y\nB) x\nAnswer with the letter.",
    ]
    assert (res.debias.decisions, res.debias.prefill_s, res.debias.prior) == (2, 1.0, None)


def test_permute_of_three_uses_the_three_cyclic_orders() -> None:
    run = Runner()
    [res] = debiased(run, [ask(["x", "y", "z"], "permute")], DebiasState())
    shown = [[t for _, t in LINE.findall(r.suffix)] for r in run.calls[0]]
    assert shown == [["x", "y", "z"], ["y", "z", "x"], ["z", "x", "y"]]
    # x at positions 0, 2, 1 of the three orders: 0.18 of 0.18+0.12+0.05, 0.03 of 0.36+0.10+0.03,
    # 0.06 of 0.30+0.06+0.06
    assert res.debias is not None
    assert res.debias.debiased_p[0] == pytest.approx((0.18 / 0.35 + 0.03 / 0.49 + 0.06 / 0.42) / 3, abs=1e-12)
    assert sum(res.debias.debiased_p) == pytest.approx(1.0, abs=1e-12)


def test_pride_estimates_the_prior_from_the_first_k_and_divides_it_out_after() -> None:
    run, state = Runner(), DebiasState(pride_sample=1)
    first, second = debiased(run, [ask(["x", "y"], "pride", id=1), ask(["x", "y"], "pride", id=2)], state)
    # The sample's prior: softmax of the mean log-probs per position, sqrt(0.6 * 6/7) : sqrt(0.4 * 1/7),
    # which is 0.75 : 0.25 (the content cancels out).
    assert first.debias is not None and second.debias is not None
    assert (first.debias.stage, first.debias.decisions, first.debias.prior_samples) == ("sample", 2, 1)
    assert first.debias.prior == pytest.approx((0.75, 0.25), abs=1e-12)
    assert first.debias.debiased_p == pytest.approx(((0.6 + 1 / 7) / 2, (0.4 + 6 / 7) / 2), abs=1e-12)
    # The later request runs once: 0.6, 0.4 divided by 0.75, 0.25 -> 0.8, 1.6 -> 1/3, 2/3.
    assert (second.debias.stage, second.debias.decisions, second.debias.prior_samples) == ("prior", 1, 1)
    assert second.debias.debiased_p == pytest.approx((1 / 3, 2 / 3), abs=1e-12)
    assert second.scores is not None and (second.scores.best, second.debias.best_raw) == (1, 0)
    assert run.decisions == 3
    # The prior is kept by the session: a third request, in a later call, divides too.
    [third] = debiased(run, [ask(["y", "z"], "pride", id=3)], state)
    assert third.debias is not None and third.debias.stage == "prior" and run.decisions == 4
    assert third.debias.debiased_p == pytest.approx((0.6 / 1.1, 0.5 / 1.1), abs=1e-12)  # 0.6 : 0.5


def test_pride_prior_is_the_mean_of_the_samples_and_is_per_label_list() -> None:
    state = DebiasState(pride_sample=2)
    two = RenderRule(labels=("1", "2"))
    results = debiased(
        Runner(),
        [ask(["x", "y"], "pride", id=1), ask(["y", "z"], "pride", id=2), ask(["x", "z"], "pride", id=3, render=two)],
        state,
    )
    assert [r.debias.stage for r in results if r.debias] == ["sample", "sample", "sample"]
    # both A/B samples give 0.75 : 0.25 (the content cancels), so their mean does too
    assert results[1].debias is not None and results[1].debias.prior == pytest.approx((0.75, 0.25))
    assert results[1].debias.prior_samples == 2
    assert results[2].debias is not None and results[2].debias.prior_samples == 1  # labels 1, 2: their own


def test_contextual_scores_the_content_free_prompt_once_per_layout_and_divides_it_out() -> None:
    run, state = Runner(), DebiasState()
    a, b = debiased(run, [ask(["x", "y"], "contextual", id=1), ask(["y", "x"], "contextual", id=2)], state)
    cf = run.calls[0][1]  # right after the first request's own decision
    assert cf.suffix == "N/A\nA) N/A\nB) N/A\nAnswer with the letter."
    # content-free: 0.24, 0.08 -> 0.75, 0.25; x, y: 0.6, 0.4 / (0.75, 0.25) -> 1/3, 2/3
    assert a.debias is not None and b.debias is not None
    assert a.debias.prior == pytest.approx((0.75, 0.25)) and a.debias.debiased_p == pytest.approx((1 / 3, 2 / 3))
    assert b.debias.debiased_p == pytest.approx((2 / 3, 1 / 3))
    assert (a.debias.decisions, b.debias.decisions, run.decisions) == (2, 1, 3)
    [c] = debiased(run, [ask(["z", "x"], "contextual", id=3)], state)  # kept: nothing more to score
    assert c.debias is not None and c.debias.decisions == 1 and run.decisions == 4
    [d] = debiased(run, [ask(["z", "x"], "contextual", id=4, suffix="other ")], state)  # another layout
    assert d.debias is not None and d.debias.decisions == 2


def test_abstaining_compares_the_debiased_probability() -> None:
    run = Runner()
    kept, dropped = debiased(
        run,
        [ask(["x", "y"], "permute", abstain_below=0.6), ask(["x", "y"], "permute", abstain_below=0.7)],
        DebiasState(),
    )
    assert kept.scores is not None and (kept.scores.best, kept.scores.abstained) == (1, False)  # y: 0.629
    assert dropped.scores is not None and (dropped.scores.best, dropped.scores.abstained) == (-1, True)
    assert all(r.abstain_below is None for r in run.calls[0])  # each permutation answers, the debiased p abstains


@pytest.mark.parametrize(
    "request_, field, words",
    [
        (
            DecideRequest(id=1, prefix="", suffix="Q", choices=("A", "B"), debias="permute"),
            "debias",
            'decide: "debias" needs the structured form: give "question" and "options"',
        ),
        (
            ask(["x", "y"], "shuffle"),
            "debias",
            'decide: "debias" is "shuffle"; give one of "permute", "pride", "contextual"',
        ),
        (ask(["x"], "permute"), "options", 'decide: "debias" needs at least 2 options to reorder, got 1'),
        (
            ask(["x", "y"], "permute", render=RenderRule(labels=("A", "A"))),
            "render",
            'decide: labels 0 and 1 are both "A"; give each option its own label',
        ),
        (
            ask(["x", "y"], render=RenderRule(labels=("A",))),
            "render",
            'decide: "render.labels" has 1 labels for 2 options; give one label per option',
        ),
        (
            ask(["x", "y"], render=RenderRule(template="{question}")),
            "render",
            'decide: "render.template" has no {options}',
        ),
        (ask(["x", "y"], render=RenderRule(option="{text}")), "render", 'decide: "render.option" has no {label}'),
        (
            ask(["x", "y"], choices=("A", "B")),
            "choices",
            'decide: give "choices" or "options" (with "question"), not both',
        ),
        (
            DecideRequest(id=1, prefix="", suffix="", choices=(), options=("x",)),
            "question",
            'decide: "options" needs "question"',
        ),
        (
            ask(["x", "y"], "permute", scoring="full", best_by="norm"),
            "best_by",
            'decide: "debias" works on the choices\' log-probs ("best_by": "sum")',
        ),
    ],
)
def test_refusals_are_per_request_and_up_front(request_: DecideRequest, field: str, words: str) -> None:
    run = Runner()
    bad, good = debiased(run, [request_, ask(["x", "y"], "permute", id=2)], DebiasState())
    assert bad.error is not None and bad.error.startswith(words) and bad.refused
    assert isinstance(bad.cause, DecideRequestError) and bad.cause.field == field
    assert good.error is None and run.decisions == 2  # nothing of the refused one ran


def test_a_failed_permutation_fails_its_request_only_and_no_sample_is_kept() -> None:
    run, state = Runner(fail_on="A) y"), DebiasState(pride_sample=1)
    bad, other = debiased(run, [ask(["x", "y"], "pride", id=1), ask(["z", "x"], "permute", id=2)], state)
    assert bad.error is not None and "boom" in bad.error and not bad.refused
    assert other.error is None and state.samples == {}
    # the planned-for prior never came: a pride request after a failed sample in the same call says so
    run2 = Runner(fail_on="A) y")
    first, second = debiased(
        run2, [ask(["x", "y"], "pride", id=3), ask(["z", "x"], "pride", id=4)], DebiasState(pride_sample=1)
    )
    assert second.error is not None and second.error.startswith('decide: "debias": "pride" has no prior')
    assert isinstance(second.cause, DecideRefusal)


def test_plain_requests_pass_through_unchanged() -> None:
    run = Runner()
    plain = DecideRequest(id=7, prefix="P ", suffix="Q\nA) x\nB) y", choices=("A", "B"))
    [res] = debiased(run, [plain], DebiasState())
    assert run.calls == [[plain]] and res.debias is None


def test_the_protocol_reads_the_structured_form_and_checks_render() -> None:
    cmd = parse_line(
        json.dumps(
            {
                "cmd": "decide",
                "id": 3,
                "prefix": "P",
                "question": "Q",
                "options": ["x", "y"],
                "render": {"labels": ["1", "2"], "joiner": " "},
                "debias": "pride",
            }
        )
    )
    r = cmd.request  # type: ignore[union-attr]
    assert (r.question, r.options, r.debias, r.choices) == ("Q", ("x", "y"), "pride", ())
    assert r.render == RenderRule(labels=("1", "2"), joiner=" ")
    with pytest.raises(ProtocolError, match=r"decide: field 'render': unknown field\(s\) 'colour'"):
        parse_line('{"cmd":"decide","question":"Q","options":["x"],"render":{"colour":1}}')
    with pytest.raises(ProtocolError, match="decide: field 'render' must be an object"):
        parse_line('{"cmd":"decide","question":"Q","options":["x"],"render":"A)"}')
    with pytest.raises(ProtocolError, match="decide: field 'render': field 'labels' must be a list of strings"):
        parse_line('{"cmd":"decide","question":"Q","options":["x"],"render":{"labels":"AB"}}')


def test_the_answer_carries_raw_and_debiased_keys() -> None:
    [res] = debiased(Runner(), [ask(["x", "y"], "pride")], DebiasState(pride_sample=3))
    out = decide_fields(res)
    assert out["best"] == 1 and out["best_raw"] == 0 and out["debias"] == "pride"
    assert out["pride_stage"] == "sample" and out["prior_samples"] == 1
    assert out["debiased_p"] == pytest.approx([(0.6 + 1 / 7) / 2, (0.4 + 6 / 7) / 2])
    assert out["prior"] == pytest.approx([0.75, 0.25]) and out["debias_decisions"] == 2
    json.dumps(out, allow_nan=False)


def test_decisions_needed_counts_what_a_request_may_run() -> None:
    from bmoe.decide.debias import decisions_needed

    ask = DecideRequest(id=1, prefix="P", suffix="", choices=(), question="Which?", options=("a", "b", "c", "d"))
    plain = DecideRequest(id=2, prefix="", suffix="A or B?", choices=("A", "B"))
    assert decisions_needed([plain]) == 1
    assert decisions_needed([replace(plain, scoring="full")]) == 3  # the prompt, then each choice
    assert decisions_needed([ask]) == 1
    assert decisions_needed([replace(ask, debias="permute")]) == 4
    assert decisions_needed([replace(ask, debias="pride")] * 3) == 12  # counted as if all still sampled
    assert decisions_needed([replace(ask, debias="contextual")]) == 2  # and the content-free prompt
    assert decisions_needed([replace(ask, debias="nope")]) == 0  # refused by the structured checks: runs nothing
