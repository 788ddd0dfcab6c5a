"""One session, one worker thread: requests run in arrival order through a bounded queue.

The session serves one request at a time (it holds a lock), so the server gives it exactly one
thread. Handlers submit a job and await its events; the worker runs the job's function against
the session and sends events back to the handler's event loop. A job beyond the queue's bound is
refused at once (503), and a job whose client left is dropped before it starts or cancelled at its
next token while it runs.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bmoe.errors import SessionClosedError, StreamFailedError
from bmoe.session import Session

# Event kinds a job sends: zero or more "step", then exactly one "result" or "error".
STEP, RESULT, ERROR = "step", "result", "error"

# The session's sticky errors: once one is raised, the session raises it for every later call, so
# the server is broken until it is restarted. Any other error (a refused request, a failed
# llama_decode) fails only the request that met it.
STICKY = (StreamFailedError, SessionClosedError)


class Cancelled(Exception):
    """The job was dropped before it ran: its client went away."""


class QueueFull(Exception):
    """The queue holds --max-queue waiting requests already; retry after ``retry_after`` s."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the server is busy: the queue is full; retry after {retry_after} s")
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Event:
    kind: str
    value: Any = None


JobFn = Callable[[Session, "Job"], Any]


class Job:
    """One request's passage through the worker."""

    def __init__(self, fn: JobFn, loop: asyncio.AbstractEventLoop, queue: JobQueue) -> None:
        self.fn = fn
        self._loop = loop
        self._queue = queue
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.finished = False

    def emit(self, kind: str, value: Any = None) -> None:
        """Called from the worker thread; a handler whose loop is gone simply misses it."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, Event(kind, value))
        except RuntimeError:  # the event loop closed (server shutting down)
            pass

    async def next_event(self) -> Event:
        return await self._events.get()

    async def outcome(self) -> Event:
        """Skip steps; the final "result" or "error" event."""
        while True:
            ev = await self._events.get()
            if ev.kind != STEP:
                return ev

    def cancel(self) -> None:
        """Thread-safe: drop the job if it still waits, stop it at its next token if it runs."""
        self.cancelled.set()
        self._queue._cancel(self)


class JobQueue:
    def __init__(self, session: Session, max_queue: int, on_drop: Callable[[], None] = lambda: None) -> None:
        """``on_drop`` is called (in the cancelling thread) for every job dropped before it ran
        because its client left."""
        if max_queue < 0:
            raise ValueError(f"max_queue: must be >= 0, got {max_queue}")
        self.session = session
        self.max_queue = max_queue
        self._on_drop = on_drop
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._closing = False
        self._durations: deque[float] = deque(maxlen=16)
        self.broken: str | None = None  # the message of a STICKY error a job raised; None while healthy
        self.last_stats: dict[str, object] = session.stats()  # refreshed by the worker only
        self._thread = threading.Thread(target=self._work, name="bmoe-engine", daemon=True)
        self._thread.start()

    # --- handler side -----------------------------------------------------------------
    def submit(self, fn: JobFn) -> Job:
        """Queue ``fn`` behind the jobs already there, or raise QueueFull. Call from a coroutine."""
        job = Job(fn, asyncio.get_running_loop(), self)
        with self._cond:
            if self._closing:
                raise QueueFull(retry_after=5)
            busy = self._running is not None or bool(self._waiting)
            if busy and len(self._waiting) >= self.max_queue:
                raise QueueFull(self._retry_after())
            self._waiting.append(job)
            self._cond.notify()
        return job

    def depth(self) -> int:
        """Requests waiting plus the one running."""
        with self._cond:
            return len(self._waiting) + (self._running is not None)

    def _retry_after(self) -> int:
        # Whole seconds until a slot frees up, from the recent job durations; at least one.
        mean = sum(self._durations) / len(self._durations) if self._durations else 1.0
        return max(1, min(300, math.ceil(mean * (len(self._waiting) + 1))))

    def _cancel(self, job: Job) -> None:
        with self._cond:
            dropped = job in self._waiting
            if dropped:
                self._waiting.remove(job)
                job.finished = True
                job.emit(ERROR, Cancelled("the client closed the request before it ran"))
            elif self._running is job:
                # Under the lock: the worker cannot move on to the next job meanwhile, so this
                # cancel cannot land on someone else's generation. Takes effect at the next token.
                self.session.cancel()
        if dropped:
            self._on_drop()

    # --- worker side ------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                job = self._waiting.popleft()
                self._running = job
            t0 = time.perf_counter()
            try:
                event = Event(RESULT, job.fn(self.session, job))
            except BaseException as e:  # every failure goes back to the request that caused it
                event = Event(ERROR, e)
                if isinstance(e, STICKY):
                    self.broken = str(e)  # every later request would fail the same way: /health reports it
            try:
                self.last_stats = self.session.stats()
            except Exception:  # a closed session: keep the last figures
                pass
            # Free the slot before answering, so a client that sends its next request as soon as it
            # has this answer never finds the server busy with its own previous one.
            with self._cond:
                self._running = None
                job.finished = True
                self._durations.append(time.perf_counter() - t0)
            job.emit(event.kind, event.value)

    def close(self, timeout: float = 30.0) -> None:
        """Stop taking jobs, cancel the running one, and wait for the worker to end."""
        with self._cond:
            self._closing = True
            dropped = list(self._waiting)
            self._waiting.clear()
            running = self._running
            self._cond.notify_all()
        for job in dropped:
            job.emit(ERROR, QueueFull(retry_after=5))
        if running is not None:
            running.cancelled.set()
            self.session.cancel()
        self._thread.join(timeout)
