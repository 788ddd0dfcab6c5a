"""A decision list stops when it is cancelled: between decisions, and between the llama_decode calls
of a batch; what has not run is answered as cancelled, and the session answers the next list as a
session that never saw the cancelled one would."""

from __future__ import annotations

import threading

from bmoe.decide.errors import DecideCancelled
from bmoe.decide.types import DecideRequest

P1 = "You control a phone. Task: turn on Wi-Fi. History:"
SUFFIXES = [
    " none. Screen: Home. Options: A) Open Settings B) Open Camera C) Call Mom. Answer with the letter.",
    " none. Screen: Settings. Options: A) Network B) Display C) Battery. Answer with the letter.",
    " Screen: Network. Options: A) Bluetooth B) Internet C) Hotspot. Answer with the letter.",
    " opened Settings. Screen: Display. Options: A) Brightness B) Font C) Back. Answer with the letter.",
]
ABC = ("A", "B", "C")


class Trips(threading.Event):
    """An event that reads as set from its ``after + 1``-th look on: a client that leaves part-way."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after, self.looks = after, 0

    def is_set(self) -> bool:
        self.looks += 1
        return self.looks > self.after or super().is_set()


def _cancelled(result) -> bool:
    return isinstance(result.cause, DecideCancelled) and result.scores is None and "cancelled" in result.error


def test_a_cancelled_list_stops_between_decisions(open_tiny) -> None:
    s = open_tiny(decide=True, decide_batch=1)
    fresh = open_tiny(decide=True, decide_batch=1)
    alone = [DecideRequest(id=i, prefix=f"Agent {i}. " + P1, suffix=x, choices=ABC) for i, x in enumerate(SUFFIXES)]
    got = s.decide_many(alone, cancel=Trips(after=1))  # the first decision runs, then the client is gone
    assert got[0].error is None and all(_cancelled(r) for r in got[1:])
    assert [r.id for r in got] == [0, 1, 2, 3]
    # the session goes on as one that only ever answered the first decision
    again = s.decide_many(alone[1:])
    want = fresh.decide_many(alone[:1]) and fresh.decide_many(alone[1:])
    assert [r.scores.choice_logp for r in again] == [r.scores.choice_logp for r in want]
    # an event set before the list starts: nothing runs
    set_before = threading.Event()
    set_before.set()
    assert all(_cancelled(r) for r in s.decide_many(alone, cancel=set_before))


def test_a_batch_stops_between_its_llama_decode_calls(open_tiny) -> None:
    # a ubatch of 32 tokens holds one ~30-token suffix: the batch of four takes four calls
    s = open_tiny(decide=True, decide_batch=4, n_batch=32, n_ubatch=32)
    fresh = open_tiny(decide=True, decide_batch=4, n_batch=32, n_ubatch=32)
    batch = [DecideRequest(id=i, prefix=P1, suffix=x, choices=ABC) for i, x in enumerate(SUFFIXES)]
    trips = Trips(after=2)  # the look before the batch, the look before its first call, then gone
    got = s.decide_many(batch, cancel=trips)
    assert all(_cancelled(r) for r in got) and trips.looks == 3
    again = s.decide_many(batch)
    want = fresh.decide_many(batch)
    assert all(r.error is None for r in again)
    assert [r.scores.choice_logp for r in again] == [r.scores.choice_logp for r in want]
    assert again[0].batch is not None and again[0].batch.size == 4


def test_cancel_reaches_a_running_decision_list(open_tiny) -> None:
    """Session.cancel() from another thread stops a list the way the caller's event does."""
    s = open_tiny(decide=True, decide_batch=1)
    requests = [DecideRequest(id=i, prefix=f"Agent {i}. " + P1, suffix=SUFFIXES[0], choices=ABC) for i in range(40)]
    started = threading.Event()
    real = s.decider.decider.seq.prefill

    def prefill(*a, **kw):
        started.set()
        return real(*a, **kw)

    s.decider.decider.seq.prefill = prefill  # type: ignore[method-assign]
    out: list = []
    t = threading.Thread(target=lambda: out.extend(s.decide_many(requests)))
    t.start()
    assert started.wait(60)
    s.cancel()
    t.join(120)
    assert not t.is_alive()
    assert len(out) == 40 and any(_cancelled(r) for r in out) and out[0].error is None
