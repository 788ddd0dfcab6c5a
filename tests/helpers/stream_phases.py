from __future__ import annotations

import threading

from bmoe.stream import Streamer
from bmoe.stream.reader import StreamIOError
from helpers.stream import expert_bytes_in_buffer


def present(s: Streamer, data: bytes, il: int, experts, projs) -> bool:  # noqa: ANN001
    return all(
        expert_bytes_in_buffer(s, t, e) == data[t.slice_offset(e) :][: t.slice_nbytes]
        for t in s.layout.layer_tensors(il)
        if t.proj in projs
        for e in experts
    )


class HeldReads:
    """Wraps the reader's per-chunk read: records which projection each chunk fills, in the order
    the lanes take them, and holds the chunks of ``hold`` until ``release`` is set."""

    def __init__(self, s: Streamer, hold: str | None = None, fail: str | None = None) -> None:
        self.s, self.hold, self.fail = s, hold, fail
        self.release = threading.Event()
        self.taken: list[str] = []
        self._inner = s.reader._read_one
        self._proj = {id(s.cache._buffers[k].window): (k if isinstance(k, str) else k[1]) for k in s.cache._buffers}
        s.reader._read_one = self

    def __call__(self, op) -> None:  # noqa: ANN001
        proj = self._proj[id(op.window)]
        self.taken.append(proj)
        if proj == self.hold:
            assert self.release.wait(10)
        if proj == self.fail:
            raise StreamIOError(f"injected failure reading {proj}")
        self._inner(op)
