"""DecideService: what a session holds for decide, the debiasing wrapper around its ``Decider``.

A request list goes down once: requests over the work bound are refused alone (``too_much_work``),
the others expanded into the plain decisions to run (``debias.expand``), answered by the decider
and combined into one answer per request (``debias.combine``). Nothing here calls back up, and
nothing imports the engine (docs/decide.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bmoe.decide.debias import PRIDE_SAMPLE, DebiasState, combine, decisions_needed, expand
from bmoe.decide.decider import Decider
from bmoe.decide.errors import DecideRequestError
from bmoe.decide.types import DecideRequest, DecideResult

MAX_WORK = 1024  # prefills one request may take by default (SessionConfig.decide_max_work)


def too_much_work(request: DecideRequest, max_work: int) -> DecideResult | None:
    """The refusal of a request that may take more than ``max_work`` prefills, or None. Every
    surface (the line protocol, bmoe-eval, bmoe-batch, Python) goes through here; the server also
    bounds a whole HTTP request (--max-request-decisions)."""
    need = decisions_needed([request])
    if need <= max_work:
        return None
    msg = (
        f"decide: this request may take {need} prefills (each debias permutation, pride sample and choice "
        f"scored in full counts one), over this session's limit of {max_work} a request (--decide-max-work); "
        "give fewer choices, or raise the limit"
    )
    return DecideResult.failed(request.id, msg, DecideRequestError(msg, field="choices"))


class DecideService:
    """Created only for sessions opened with decide on, so a session without it allocates
    nothing. ``decider`` answers the plain decisions; ``pride_sample``: debias ``pride``'s sample
    size per label list; ``max_work``: the most prefills one request may take."""

    def __init__(self, decider: Decider, *, pride_sample: int = PRIDE_SAMPLE, max_work: int = MAX_WORK) -> None:
        self.decider = decider
        self.max_work = max_work
        # Order debiasing's per-session state: PriDe's priors, contextual calibration's layouts.
        self.debias = DebiasState(pride_sample=pride_sample)

    def answer(self, requests: Sequence[DecideRequest], stop: Callable[[], bool] = lambda: False) -> list[DecideResult]:
        """One answer per request, in order, each as if answered alone after the ones before it.
        ``stop`` is asked between decisions (and between the calls of a batch): once it says so,
        what has not run is answered as cancelled (``DecideCancelled``)."""
        over = {i: res for i, r in enumerate(requests) if (res := too_much_work(r, self.max_work)) is not None}
        if over:  # refused alone, before anything runs; the others are answered as without them
            rest = self.answer([r for i, r in enumerate(requests) if i not in over], stop)
            it = iter(rest)
            return [over[i] if i in over else next(it) for i in range(len(requests))]
        expansion = expand(requests, self.debias)
        jobs = expansion.jobs
        answers = self.decider.answer(jobs, stop) if jobs else []
        return combine(expansion, answers, self.debias)

    def drop(self) -> None:
        """Drop the kept prefix state (a generate() or a score() is about to overwrite the
        sequence): it is only worth its RAM between decisions."""
        self.decider.drop()
