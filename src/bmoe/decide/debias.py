"""Order debiasing: taking a model's preference for option positions out of a decision.

Pure policy in two steps around whatever answers plain requests: ``expand`` turns requests into
the plain decisions to run (the options in other orders, or the content-free prompt), meant for
one run so that they share the kept prefix; ``combine`` turns their answers into one answer per
request. ``DecideService.answer`` does both around the decider. The three modes (``permute``,
``pride``, ``contextual``) and their formulas: docs/decide.md, "Order debiasing".
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from bmoe.decide.errors import DecideRefusal
from bmoe.decide.option_list import check_structured, labels_of, rendered, rotation
from bmoe.decide.types import DebiasScores, DecideRequest, DecideResult
from bmoe.numerics import log_softmax

PRIDE_SAMPLE = 8  # default K: pride requests per label list that estimate the prior
MAX_LAYOUTS = 256  # contextual calibrations kept per session, the oldest forgotten first


class NoPriorError(DecideRefusal):
    """A pride request planned to divide by the prior found none: every sample before it failed."""


def label_logp(choice_logp: Sequence[float]) -> np.ndarray:
    """Log of the labels' probabilities renormalised over the labels ``# [n]``."""
    return log_softmax(np.asarray(choice_logp, dtype=np.float64))


def permuted_p(runs: Sequence[Sequence[float]]) -> np.ndarray:
    """Debiased probabilities by content from the n cyclic permutations' ``choice_logp``
    (``runs[k]`` is permutation k, position i showing option (i + k) mod n)."""
    n = len(runs)
    p = np.exp(np.stack([label_logp(r) for r in runs]))  # [n perms, n positions]
    return np.array([np.mean([p[k, (o - k) % n] for k in range(n)]) for o in range(n)])


def sample_prior(runs: Sequence[Sequence[float]]) -> np.ndarray:
    """PriDe's prior over label positions from one request's permutations: softmax over positions
    of the mean over permutations of each position's log-probability."""
    return np.exp(log_softmax(np.mean(np.stack([label_logp(r) for r in runs]), axis=0)))


def divided_p(choice_logp: Sequence[float], prior: np.ndarray) -> np.ndarray:
    """The labels' probabilities divided by ``prior`` (per position) and renormalised."""
    tiny = np.finfo(np.float64).tiny
    return np.exp(log_softmax(label_logp(choice_logp) - np.log(np.maximum(prior, tiny))))


@dataclass
class DebiasState:
    """What a session keeps for debiasing: PriDe's sample priors per label list, and contextual
    calibration's content-free probabilities per layout."""

    pride_sample: int = PRIDE_SAMPLE
    samples: dict[tuple[str, ...], list[np.ndarray]] = field(default_factory=dict)
    content_free: OrderedDict[tuple, np.ndarray] = field(default_factory=OrderedDict)

    def prior(self, labels: tuple[str, ...]) -> np.ndarray | None:
        got = self.samples.get(labels)
        return np.mean(np.stack(got), axis=0) if got else None

    def remember(self, key: tuple, p: np.ndarray) -> None:
        self.content_free[key] = p
        self.content_free.move_to_end(key)
        while len(self.content_free) > MAX_LAYOUTS:
            self.content_free.popitem(last=False)


@dataclass
class _Expanded:
    request: DecideRequest
    jobs: list[int]  # indexes into the jobs' answers: the request's own decisions
    stage: str | None = None  # pride: "sample" or "prior"
    cf_key: tuple | None = None  # contextual: the layout
    cf_job: int | None = None  # contextual: the content-free decision, when this request runs it


def _layout(r: DecideRequest) -> tuple:
    return (r.prefix, r.suffix, r.render, labels_of(r), r.scoring, r.unconditional)


@dataclass
class Expansion:
    """What ``expand`` made of a request list: the plain decisions to run, in order, and per
    request which of them are its own (or its refusal)."""

    jobs: list[DecideRequest]
    expanded: list[_Expanded | DecideResult]


def expand(requests: Sequence[DecideRequest], state: DebiasState) -> Expansion:
    """The plain decisions that answer ``requests`` in order (plain, structured and debiased
    alike): a plain request is its own one; a structured one is rendered, once per permutation
    it needs and, for ``contextual``, once more content-free when its layout is not known yet.
    A request refused by the structured form's checks runs nothing."""
    jobs: list[DecideRequest] = []
    expanded: list[_Expanded | DecideResult] = []
    planned_samples: dict[tuple[str, ...], int] = {}
    planned_cf: set[tuple] = set()
    for r in requests:
        try:
            check_structured(r)
        except DecideRefusal as exc:
            expanded.append(DecideResult.failed(r.id, str(exc), exc))
            continue
        start = len(jobs)
        if r.options is None:
            jobs.append(r)
            expanded.append(_Expanded(r, [start]))
            continue
        ex = _Expanded(r, [])
        labels = labels_of(r)
        n = len(labels)
        permute = r.debias == "permute"
        if r.debias == "pride":
            done = len(state.samples.get(labels, ())) + planned_samples.get(labels, 0)
            ex.stage = "sample" if done < state.pride_sample else "prior"
            permute = ex.stage == "sample"
            planned_samples[labels] = planned_samples.get(labels, 0) + permute
        debias = r.debias is not None
        orders = [rotation(n, k) for k in range(n)] if permute else [None]
        for order in orders:
            ex.jobs.append(len(jobs))
            jobs.append(rendered(r, order, keep_abstain=not debias))
        if r.debias == "contextual":
            ex.cf_key = _layout(r)
            if ex.cf_key not in state.content_free and ex.cf_key not in planned_cf:
                planned_cf.add(ex.cf_key)
                ex.cf_job = len(jobs)
                jobs.append(rendered(r, content_free=True, keep_abstain=False))
        expanded.append(ex)
    return Expansion(jobs, expanded)


def decisions_needed(requests: Sequence[DecideRequest]) -> int:
    """The most prefills answering ``requests`` can take, a bound to check before any work: each
    plain decision they expand to counts 1 (a permutation of ``permute``, a ``pride`` sample as if
    every pride request were still sampling, ``contextual``'s content-free prompt as if its layout
    were new), plus one per choice of a request scored in full. A request the structured form's
    checks refuse runs nothing and counts 0."""
    jobs = expand(requests, DebiasState(pride_sample=len(requests) + 1)).jobs
    return sum(1 + (len(j.choices) if j.scoring == "full" else 0) for j in jobs)


def combine(expansion: Expansion, answers: list[DecideResult], state: DebiasState) -> list[DecideResult]:
    """One answer per request of ``expansion`` from the answers of its ``jobs`` (in job order);
    PriDe's samples and contextual calibration's layouts are added to ``state``."""
    return [p if isinstance(p, DecideResult) else _combine(p, answers, state) for p in expansion.expanded]


def _combine(ex: _Expanded, answers: list[DecideResult], state: DebiasState) -> DecideResult:
    r = ex.request
    own = [answers[j] for j in ex.jobs]
    cf = answers[ex.cf_job] if ex.cf_job is not None else None
    if cf is not None and cf.error is None and cf.scores is not None and ex.cf_key is not None:
        state.remember(ex.cf_key, np.exp(label_logp(cf.scores.choice_logp)))
    failed = next((a for a in own + ([cf] if cf is not None else []) if a.error is not None or a.scores is None), None)
    if failed is not None:
        return (
            failed
            if failed is own[0]
            else DecideResult.failed(r.id, failed.error or "", failed.cause or RuntimeError(failed.error))
        )
    raw = own[0]
    if r.debias is None:
        return raw
    assert raw.scores is not None
    runs = [a.scores.choice_logp for a in own if a.scores is not None]
    labels = labels_of(r)
    prior: np.ndarray | None = None
    samples: int | None = None
    if r.debias == "permute" or ex.stage == "sample":
        p = permuted_p(runs)
        if ex.stage == "sample":
            state.samples.setdefault(labels, []).append(sample_prior(runs))
            prior, samples = state.prior(labels), len(state.samples[labels])
    elif r.debias == "pride":
        prior = state.prior(labels)
        if prior is None:
            exc = NoPriorError(
                f'decide: "debias": "pride" has no prior for the labels {", ".join(labels)} yet: '
                f'the sample requests before this one failed; send it again'
            )
            return DecideResult.failed(r.id, str(exc), exc)
        samples = len(state.samples[labels])
        p = divided_p(runs[0], prior)
    else:
        assert ex.cf_key is not None
        prior = state.content_free.get(ex.cf_key)
        if prior is None:  # the content-free decision of an earlier request of this call failed
            exc = NoPriorError(
                'decide: "debias": "contextual" has no content-free probabilities for this layout: '
                'the content-free decision of an earlier request failed; send it again'
            )
            return DecideResult.failed(r.id, str(exc), exc)
        p = divided_p(runs[0], prior)
    best = int(np.argmax(p))
    abstained = r.abstain_below is not None and float(p[best]) < r.abstain_below
    spent = own + ([cf] if cf is not None else [])
    info = DebiasScores(
        mode=r.debias,
        debiased_p=tuple(float(x) for x in p),
        best_raw=int(np.argmax(raw.scores.choice_logp)),
        prior=None if prior is None else tuple(float(x) for x in prior),
        prior_samples=samples,
        decisions=len(spent),
        prefill_s=sum(a.prefill_s + a.score_s for a in spent),
        stage=ex.stage,
    )
    scores = replace(raw.scores, best=-1 if abstained else best, abstained=abstained)
    return replace(raw, scores=scores, debias=info)
