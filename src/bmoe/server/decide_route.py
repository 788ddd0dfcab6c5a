"""POST /v1/decide: one decision (an object) or several in order (a list), as BMOE_DECIDE objects.

A list is answered like the protocol's decide_batch: every item gets its own BMOE_DECIDE object,
a refused one ``{"id", "error"}``, and the status is 200. A single refused request is a 400 whose
error names the field that made it unanswerable.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from bmoe.decide import errors as derr
from bmoe.decide.debias import NoPriorError, decisions_needed
from bmoe.decide.errors import DecideCancelled
from bmoe.decide.fields import decide_request
from bmoe.decide.types import DecideRequest, DecideResult
from bmoe.server.errors import ApiError
from bmoe.server.images import inline_bytes
from bmoe.server.job_queue import Cancelled, Job, JobQueue
from bmoe.server.metrics import Metrics
from bmoe.server.run_job import run_job
from bmoe.server.schemas import DecideBatch, DecideBody
from bmoe.wire.records import decide_fields

# Which request field each up-front refusal is about.
_PARAM: dict[type, str] = {
    derr.NoChoicesError: "choices",
    derr.EmptyChoiceError: "choices",
    derr.ChoiceCollisionError: "choices",
    derr.EmptyPromptError: "suffix",
    derr.PromptTooLongError: "prefix",
    derr.DecideRequestError: "abstain_below",
    derr.ChoiceTooLongError: "choices",
    derr.NoSideSequenceError: "scoring",
    NoPriorError: "debias",
}


def to_request(b: DecideBody, param: str = "images") -> DecideRequest:
    """The request of a checked body, built as the protocol builds a decide line's; its images
    (data: URLs only) decoded to bytes, so that the session opens no file a client names."""
    return decide_request({**b.model_dump(), "images": inline_bytes(b.images, param)})


def _param(r: DecideResult) -> str | None:
    if isinstance(r.cause, derr.DecideRequestError) and r.cause.field is not None:
        return r.cause.field  # the field whose value was refused
    return next((p for t, p in _PARAM.items() if isinstance(r.cause, t)), None)


class DecideRoute:
    def __init__(self, queue: JobQueue, metrics: Metrics, max_decisions: int = 32) -> None:
        self.queue, self.metrics, self.max_decisions = queue, metrics, max_decisions

    def _fn(self, requests: list[DecideRequest]):
        def fn(session, job: Job) -> list[DecideResult]:
            # the job's event: a client that leaves stops the list between decisions
            results = session.decide_many(requests, cancel=job.cancelled)
            for r in results:
                if not isinstance(r.cause, DecideCancelled):
                    self.metrics.decision(r)
            if job.cancelled.is_set():  # stopped because its client left: counted as chat's are
                self.metrics.cancelled.inc()
                raise Cancelled("the client closed the request")
            return results

        return fn

    def _check_work(self, requests: list[DecideRequest]) -> None:
        """Refuse, before it is queued, a request that could hold the worker for more decisions
        than the server allows one request."""
        need = decisions_needed(requests)
        if need > self.max_decisions:
            raise ApiError(
                400,
                f"decide: this request may run {need} decisions (each debias permutation, pride "
                f"sample and choice scored in full counts one), over this server's limit of "
                f"{self.max_decisions} a request (--max-request-decisions); send it in smaller "
                "requests",
                None,
                "too_much_work",
            )

    async def __call__(self, body: DecideBody | DecideBatch, request: Request) -> Any:
        batch = isinstance(body, list)
        items = body if isinstance(body, list) else [body]
        # data: URLs only, decoded to bytes and refused before anything is queued
        requests = [to_request(b, f"{k}.images" if batch else "images") for k, b in enumerate(items)]
        self._check_work(requests)
        # One whose client left while it waited is dropped; a running one stops at the next decision.
        # A RequestError from the session: decide is off in it.
        results: list[DecideResult] = await run_job(
            self.queue, request, self._fn(requests), request_error=lambda e: ApiError(400, str(e), None, "decide_off")
        )
        if batch:
            return [decide_fields(r) for r in results]
        r = results[0]
        if r.error is not None:
            status = 400 if r.refused else 500
            raise ApiError(
                status, r.error, _param(r) if r.refused else None, "decide_refused" if r.refused else "engine_error"
            )
        return decide_fields(r)
