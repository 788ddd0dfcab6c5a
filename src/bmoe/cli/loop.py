"""The --session loop: JSON requests on stdin, BMOE_* lines on stdout.

A reader thread parses lines as they arrive, so a cancel takes effect while a generation
runs; every other command is queued and served in order by the main thread, which is the
only writer of stdout. Nothing a client sends ends the loop except close or EOF.
"""
from __future__ import annotations

import queue
import threading
import traceback
from typing import TextIO

from bmoe.errors import BmoeError, RequestError, SessionClosedError, StreamFailedError
from bmoe.runtime.results import GenerateRequest
from bmoe.session import Session
from bmoe.wire import records as telemetry
from bmoe.wire.protocol import Cancel, Close, Decide, DecideBatch, ProtocolError, Stats, parse_line

DECIDE_OFF = "decide is off in this session: start it with --decide"

_EOF = object()


def _reader(stream: TextIO, session: Session, q: "queue.Queue[object]") -> None:
    for raw in stream:
        line = raw.strip()
        if not line:
            continue
        try:
            cmd = parse_line(line)
        except ProtocolError as e:
            q.put(e)
            continue
        if isinstance(cmd, Cancel):
            session.cancel()
            continue
        q.put(cmd)
        if isinstance(cmd, Close):
            return
    q.put(_EOF)


class _Out:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()


def run_session(session: Session, stdin: TextIO, stdout: TextIO) -> int:
    emit = _Out(stdout)
    m = session.model
    emit(telemetry.ready(
        load_s=session.load_s, arch=m.arch, n_ctx=session.n_ctx, think_ctl=session.chat.think_ctl,
        n_expert_used=m.n_expert_used, model=str(session.config.model), streaming=session.config.moe_stream,
        decide=session.config.decide, load_read_mib=session.load_read_bytes / 2**20,
    ))
    q: "queue.Queue[object]" = queue.Queue()
    threading.Thread(target=_reader, args=(stdin, session, q), daemon=True, name="bmoe-stdin").start()
    while True:
        item = q.get()
        if item is _EOF or isinstance(item, Close):
            return 0
        try:
            _serve(session, item, emit)
        except RequestError as e:
            emit(telemetry.error(getattr(e, "request_id", None), str(e), fatal=False))
        except (StreamFailedError, SessionClosedError) as e:  # sticky: the session cannot go on
            emit(telemetry.error(None, str(e), fatal=True))
            return 1
        except BmoeError as e:  # this request failed; the session stays usable
            emit(telemetry.error(getattr(e, "request_id", None), str(e), fatal=False))
        except Exception as e:  # a bug must not take the session down with it
            traceback.print_exc()
            emit(telemetry.error(None, f"internal error: {type(e).__name__}: {e}", fatal=False))


def _serve(session: Session, item: object, emit: _Out) -> None:
    if isinstance(item, ProtocolError):
        raise item
    if isinstance(item, GenerateRequest):
        _generate(session, item, emit)
    elif isinstance(item, Stats):
        emit(telemetry.line("STATS", {"id": item.id, **session.stats()}))
    elif isinstance(item, (Decide, DecideBatch)):
        _decide(session, item, emit)


def _decide(session: Session, cmd: Decide | DecideBatch, emit: _Out) -> None:
    items = cmd.requests if isinstance(cmd, DecideBatch) else (cmd,)
    if session.decider is None:
        for item in items:
            emit(telemetry.line("DECIDE", {"id": item.id, "error": DECIDE_OFF}))
        return
    requests = [item.request for item in items]
    results = session.decide_many(requests) if isinstance(cmd, DecideBatch) else [session.decide(requests[0])]
    for r in results:
        emit(telemetry.decide(r))


def _generate(session: Session, req: GenerateRequest, emit: _Out) -> None:
    steps = req.n_predict or session.config.n_predict
    it = session.generate_iter(req)
    started = False
    while True:
        try:
            step = next(it)
        except StopIteration as stop:
            if not started:
                emit(telemetry.begin(req.id))
            emit(telemetry.done(stop.value))
            return
        except RequestError as e:
            e.request_id = req.id  # type: ignore[attr-defined]
            raise
        if not started:
            emit(telemetry.begin(req.id))
            started = True
        if step.read_mb > 0:
            emit(telemetry.load(step))
        emit(telemetry.progress(step, steps, session.dense_resident_frac()))
