"""The --session loop: JSON requests on stdin, BMOE_* lines on stdout.

A reader thread reads stdin as bytes, one line of at most MAX_LINE_BYTES at a time (the rest of
a longer line is read in chunks and dropped), decodes and parses it, and queues it; a cancel is
acted on there and then, so it reaches a generation that is running or still queued. The main
thread serves the queue in order and is the only writer of stdout. Nothing a client sends ends
the loop except close or end of input; a reader that cannot read stdin says so and ends it too.
"""

from __future__ import annotations

import queue
import threading
import traceback
from dataclasses import dataclass, field
from typing import BinaryIO, TextIO

from bmoe.errors import BmoeError, SessionClosedError, StreamFailedError
from bmoe.session import DecideOffError, GenerateRequest, Session
from bmoe.wire import records
from bmoe.wire.protocol import (
    Cancel,
    Close,
    Decide,
    DecideBatch,
    ProtocolError,
    Stats,
    decode_line,
    line_too_long,
    parse_line,
    read_lines,
)

JSON_SPACE = " \t\r\n"  # a line of only these is skipped unanswered

_EOF = object()


@dataclass(eq=False)
class _Job:
    """A generate request as read, with the event a cancel line sets."""

    req: GenerateRequest
    cancel: threading.Event = field(default_factory=threading.Event)


class _Live:
    """The generate requests read and not yet finished, oldest first: what a cancel can reach.
    A cancel takes the oldest of them (of its id, when it names one) that no cancel took yet;
    a request read after the cancel is never among them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: list[_Job] = []

    def add(self, req: GenerateRequest) -> _Job:
        job = _Job(req)
        with self._lock:
            self._jobs.append(job)
        return job

    def finished(self, job: _Job) -> None:
        with self._lock:
            self._jobs.remove(job)

    def cancel(self, rid: int | None) -> None:
        with self._lock:
            for job in self._jobs:
                if not job.cancel.is_set() and (rid is None or job.req.id == rid):
                    job.cancel.set()
                    return


@dataclass
class _Internal:
    """A line whose parsing hit a bug: answered as an internal error, the loop goes on."""

    exc: Exception


@dataclass
class _ReadFailed:
    """Reading stdin raised: nothing more can be read, the loop ends."""

    exc: BaseException


def _read_one(raw: bytes | None, live: _Live) -> object | None:
    """One line -> what the main thread serves (None: nothing to answer)."""
    try:
        if raw is None:
            raise line_too_long()
        text = decode_line(raw).strip(JSON_SPACE)
        if not text:
            return None
        cmd = parse_line(text)
        if isinstance(cmd, Cancel):
            live.cancel(cmd.id)
            return None
        return live.add(cmd) if isinstance(cmd, GenerateRequest) else cmd
    except ProtocolError as e:
        return e
    except Exception as e:  # a bug must not kill the reader: the line is answered, reading goes on
        return _Internal(e)


def _reader(stream: TextIO | BinaryIO, live: _Live, q: "queue.Queue[object]") -> None:
    try:
        for raw in read_lines(stream):
            item = _read_one(raw, live)
            if item is not None:
                q.put(item)
            if isinstance(item, Close):
                return
    except BaseException as e:  # reading stdin failed: say so and end the loop, never hang it
        q.put(_ReadFailed(e))
    finally:
        q.put(_EOF)


class _Out:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()


def _request_id(item: object) -> int | None:
    """The id the errors of ``item`` carry: the one its other answers carry (None: unknown)."""
    if isinstance(item, ProtocolError):
        return item.request_id
    if isinstance(item, _Job):
        return item.req.id
    if isinstance(item, (Stats, Decide, DecideBatch)):
        return item.id
    return None


def run_session(session: Session, stdin: TextIO | BinaryIO, stdout: TextIO) -> int:
    emit = _Out(stdout)
    m = session.model
    emit(
        records.ready(
            load_s=session.load_s,
            arch=m.arch,
            n_ctx=session.n_ctx,
            think_ctl=session.chat.think_ctl,
            n_expert_used=m.n_expert_used,
            model=str(session.config.model),
            streaming=session.config.moe_stream,
            decide=session.config.decide,
            load_read_mib=session.load_read_bytes / 2**20,
            dense_weights=session.streaming.dense_weights if session.streaming is not None else None,
            dense_anon_mib=session.dense_anon_bytes / 2**20,
            n_expert_used_gguf=m.n_expert_used_gguf,
            plan=session.plan.as_json() if session.plan is not None else None,
        )
    )
    live = _Live()
    q: "queue.Queue[object]" = queue.Queue()
    threading.Thread(target=_reader, args=(stdin, live, q), daemon=True, name="bmoe-stdin").start()
    while True:
        item = q.get()
        if item is _EOF or isinstance(item, Close):
            return 0
        if isinstance(item, _ReadFailed):
            emit(records.error(None, f"reading stdin failed: {type(item.exc).__name__}: {item.exc}", fatal=True))
            return 1
        rid = _request_id(item)
        try:
            _serve(session, item, emit)
        except (StreamFailedError, SessionClosedError) as e:  # sticky: the session cannot go on
            emit(records.error(rid, str(e), fatal=True))
            return 1
        except BmoeError as e:  # this request was refused or failed; the session stays usable
            emit(records.error(rid, str(e), fatal=False))
        except Exception as e:  # a bug must not take the session down with it
            traceback.print_exc()
            emit(records.error(rid, f"internal error: {type(e).__name__}: {e}", fatal=False))
        finally:
            if isinstance(item, _Job):
                live.finished(item)


def _serve(session: Session, item: object, emit: _Out) -> None:
    if isinstance(item, ProtocolError):
        raise item
    if isinstance(item, _Internal):
        raise item.exc
    if isinstance(item, _Job):
        _generate(session, item, emit)
    elif isinstance(item, Stats):
        emit(records.line("STATS", {"id": item.id, **session.stats()}))
    elif isinstance(item, (Decide, DecideBatch)):
        _decide(session, item, emit)


def _decide(session: Session, cmd: Decide | DecideBatch, emit: _Out) -> None:
    items = cmd.requests if isinstance(cmd, DecideBatch) else (cmd,)
    requests = [item.request for item in items]
    try:
        results = session.decide_many(requests) if isinstance(cmd, DecideBatch) else [session.decide(requests[0])]
    except DecideOffError as e:  # the session's one check; each request is answered with it
        for item in items:
            emit(records.line("DECIDE", {"id": item.id, "error": str(e)}))
        return
    for r in results:
        emit(records.decide(r))


def _generate(session: Session, job: _Job, emit: _Out) -> None:
    req = job.req
    steps = req.n_predict or session.config.n_predict
    it = session.generate_iter(req, cancel=job.cancel)
    started = False
    while True:
        try:
            step = next(it)
        except StopIteration as stop:
            if not started:
                emit(records.begin(req.id))
            emit(records.done(stop.value))
            return
        if not started:
            emit(records.begin(req.id))
            started = True
        for out in records.step_lines(step, steps, session.dense_resident_frac()):
            emit(out)
