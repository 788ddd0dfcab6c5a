"""A route's work on the one worker: queue it, drop it when its client leaves, and turn what went
wrong into the HTTP error every route answers the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import Request

from bmoe.errors import RequestError
from bmoe.server.errors import ApiError, from_request_error
from bmoe.server.job_queue import Cancelled, Job, JobQueue, QueueFull
from bmoe.session import Session


async def cancel_on_disconnect(request: Request, job: Job, every_s: float = 0.2) -> None:
    """Cancel the job when the client goes away, while it waits, prefills or decodes."""
    while not job.finished:
        if await request.is_disconnected():
            job.cancel()
            return
        await asyncio.sleep(every_s)


def job_error(e: BaseException, request_error: Callable[[RequestError], ApiError]) -> Exception:
    """The exception a route raises for a job that failed with ``e``: a refusal as itself, a job
    dropped by a server shutting down (QueueFull) as itself, a cancelled one as 499, a session's
    RequestError as ``request_error`` says, anything else as a 500 naming it."""
    if isinstance(e, (ApiError, QueueFull)):
        return e
    if isinstance(e, Cancelled):  # nobody is left to read this
        return ApiError(499, str(e), None, "cancelled")
    if isinstance(e, RequestError):
        return request_error(e)
    return ApiError(500, f"the engine failed: {type(e).__name__}: {e}", None, "engine_error")


async def run_job(
    queue: JobQueue,
    request: Request,
    fn: Callable[[Session, Job], Any],
    request_error: Callable[[RequestError], ApiError] = lambda e: from_request_error(e, None),
) -> Any:
    """Queue ``fn`` on the worker and return its result; a client that leaves while it waits
    drops it. A failure is raised as ``job_error`` maps it."""
    job = queue.submit(fn)
    watcher = asyncio.create_task(cancel_on_disconnect(request, job))
    try:
        ev = await job.outcome()
    finally:
        watcher.cancel()
        if not job.finished:
            job.cancel()
    if ev.kind == "error":
        raise job_error(ev.value, request_error) from ev.value
    return ev.value
