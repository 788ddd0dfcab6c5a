"""DecideService: a session's decide settings, kept state and backend, in one place.

A decision goes down once: the session calls ``answer``; it expands the requests into the plain
decisions to run (``debias.expand``), checks them (``decider.check_requests``), runs them over
the backend port (``decider.answer_checked``) and combines their answers (``debias.combine``).
Nothing here calls back up, and nothing here imports the engine: the settings come as plain
values, the model as a ``DecideBackend``.

When side sequences open: a backend may have none yet (``decide_batch`` auto opens them late, so
that a session that never batches never pays their memory). Before a list of plain decisions
runs, if it would use them (a full-scored request, or two first-token decisions that keep the
same prefix: ``wants_side_sequences``) and none are open, the service drops its kept prefix state
and has the backend open them, before anything of the list is prefilled: opening may cost the
sequence its KV, which the kept state may live in. The next decision prefills its prefix again
(exact, just not reused once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bmoe.decide.continuations import NeutralStore
from bmoe.decide.debias import PRIDE_SAMPLE, DebiasState, combine, decisions_needed, expand
from bmoe.decide.decider import (
    DecidePolicy,
    answer_checked,
    check_requests,
    failure_message,
    wants_side_sequences,
)
from bmoe.decide.errors import DecideRequestError
from bmoe.decide.kept_prefix import LastPrefixStore
from bmoe.decide.port import DecideBackend
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
    nothing. ``keep_prefix``: whether prefix states are kept (``resolve_keep_prefix``);
    ``pride_sample``: debias ``pride``'s sample size per label list."""

    def __init__(
        self, backend: DecideBackend, *, keep_prefix: bool, pride_sample: int = PRIDE_SAMPLE, max_work: int = MAX_WORK
    ) -> None:
        self.backend = backend
        self.max_work = max_work
        self.policy = DecidePolicy(keep_prefix=keep_prefix)
        self.store = LastPrefixStore()
        backend.watch_kept(self.store)
        # The neutral prompt's side of full scoring: kept for the session's life (a generate()
        # does not touch it: it lives in a copy, not in the sequence).
        self.neutral = NeutralStore()
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
        answers = self._answer_plain(jobs, stop) if jobs else []
        return combine(expansion, answers, self.debias)

    def _answer_plain(self, jobs: Sequence[DecideRequest], stop: Callable[[], bool]) -> list[DecideResult]:
        checked = check_requests(self.backend, jobs)
        if wants_side_sequences(jobs, checked, self.policy):
            try:
                self._open_side_sequences()
            except Exception as exc:  # the engine failed while re-creating its context
                msg = failure_message("opening the side sequences", exc)
                return [
                    c if isinstance(c, DecideResult) else DecideResult.failed(r.id, msg, exc)
                    for r, c in zip(jobs, checked)
                ]
        return answer_checked(self.backend, self.store, jobs, checked, self.policy, self.neutral, stop)

    def _open_side_sequences(self) -> None:
        """Open the backend's side sequences if none are open and some can be; the kept prefix
        state is dropped first (opening may empty the sequence it lives in)."""
        sides = self.backend.side_sequences()
        if sides.n_open or not sides.n_most:
            return  # open already, or none can be: batches run one by one, full scoring was refused
        self.store.drop()
        self.backend.forget()
        self.backend.open_side_sequences()

    def drop(self) -> None:
        """Drop the kept prefix state (a generate() or a score() is about to overwrite the
        sequence): it is only worth its RAM between decisions."""
        self.store.drop()
        self.backend.forget()
