"""The per-token split of the decode time (one-shot summary, BMOE_DONE, BMOE_PROGRESS): compute,
cache bookkeeping and waiting for reads are each >= 0 and add up to the wall time, even where the
streamer's counters claim more than the span they were measured in (a read waited for inside a
bookkeeping interval is counted in both: Streamer.on_route finishing a guess for another layer)."""

from __future__ import annotations

import re

import pytest

from bmoe.runtime.results import GenerateResult, TimeSplit
from bmoe.stream.stats import StreamStats
from bmoe.wire.records import done_fields, summary


def _result(decode_s: float, n: int, decode_io: StreamStats, io: StreamStats | None = None) -> GenerateResult:
    return GenerateResult(
        id=1,
        text="",
        reasoning="",
        tokens=tuple(range(n)),
        cancelled=False,
        stop="length",
        n_prompt=5,
        n_reused=0,
        n_past=5 + n,
        prefill_fallback="",
        prefill_s=0.5,
        decode_s=decode_s,
        load_s=0.1,
        io=io or decode_io,
        majflt=0,
        cpu_s=0.0,
        decode_io=decode_io,
    )


def _per_token(text: str) -> tuple[float, float, float, float]:
    m = re.search(
        r"per token: ([\d.]+) ms = compute ([\d.]+) ms \+ cache mgmt ([\d.]+) ms \+ "
        r"waiting for flash ([\d.]+) ms",
        text,
    )
    assert m, text
    return tuple(float(g) for g in m.groups())  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("wall", "stall", "mgmt", "parts"),
    [
        (1.0, 0.25, 0.125, (0.625, 0.125, 0.25)),  # ordinary: compute is what is left
        (1.0, 0.75, 0.5, (0.0, 0.25, 0.75)),  # stall + mgmt over the wall: mgmt gets what is left
        (1.0, 1.5, 0.25, (0.0, 0.0, 1.0)),  # stall alone over the wall: capped at it
        (0.0, 0.0, 0.0, (0.0, 0.0, 0.0)),
    ],
)
def test_the_parts_are_non_negative_and_add_up_to_the_wall(wall, stall, mgmt, parts) -> None:
    s = TimeSplit.of(wall, StreamStats(stall_s=stall, mgmt_s=mgmt))
    assert (s.compute_s, s.mgmt_s, s.stall_s) == parts
    assert s.compute_s + s.mgmt_s + s.stall_s == s.wall_s == wall
    per = s.per(4)
    assert (per.wall_s, per.compute_s, per.mgmt_s, per.stall_s) == (wall / 4, parts[0] / 4, parts[1] / 4, parts[2] / 4)


def test_summary_and_done_add_up_when_the_counters_overlap() -> None:
    # 4 tokens in 0.4 s; the counters claim 0.3 s of waiting and 0.2 s of bookkeeping (0.5 s > 0.4 s).
    # Before, the summary printed "compute 0.00 ms", mgmt 50 ms and waiting 75 ms: 125 ms of a 100 ms token.
    dec = StreamStats(read_bytes=4 << 20, io_s=0.35, stall_s=0.3, mgmt_s=0.2, routed=8, misses=8)
    r = _result(0.4, 4, dec)
    wall, compute, mgmt, stall = _per_token(summary(r))
    assert (wall, compute, mgmt, stall) == (100.0, 0.0, 25.0, 75.0)
    assert compute + mgmt + stall == wall
    d = done_fields(r)
    assert (d["stall_s_tok"], d["mgmt_s_tok"]) == (0.075, 0.025)
    # compute_s_tok keeps the protocol's meaning: what is left besides reads in flight and
    # bookkeeping, at least 0 (100 - 87.5 - 25 ms: 0)
    assert d["compute_s_tok"] == 0.0


def test_compute_is_what_the_reads_in_flight_and_the_bookkeeping_leave() -> None:
    # 4 tokens in 0.4 s, reads in flight 0.2 s (of which 0.05 s waited for), bookkeeping 0.04 s:
    # compute_s_tok = 0.1 - 0.05 - 0.01 = 0.04 s; the summary's compute counts what overlapped reads too.
    dec = StreamStats(read_bytes=4 << 20, io_s=0.2, stall_s=0.05, mgmt_s=0.04, routed=8, misses=8)
    r = _result(0.4, 4, dec)
    d = done_fields(r)
    assert d["compute_s_tok"] == pytest.approx(0.04, abs=1e-9)
    assert (d["io_s_tok"], d["mgmt_s_tok"], d["stall_s_tok"]) == (0.05, 0.01, 0.0125)
    wall, compute, mgmt, stall = _per_token(summary(r))
    assert (wall, compute, mgmt, stall) == (100.0, 77.5, 10.0, 12.5)


def test_summary_counts_the_decode_steps_only() -> None:
    # The prefill waited 2 s for reads; the 4 decode tokens 10 ms each of 100 ms.
    dec = StreamStats(read_bytes=4 << 20, io_s=0.08, stall_s=0.04, mgmt_s=0.02, routed=8, misses=8)
    io = dec.plus(StreamStats(read_bytes=60 << 20, io_s=2.5, stall_s=2.0, mgmt_s=0.1, routed=64, misses=64))
    text = summary(_result(0.4, 4, dec, io))
    assert _per_token(text) == (100.0, 85.0, 5.0, 10.0)
    assert "flash read: 64.0 MiB (1.00 MiB per decode token), 72 experts routed" in text
