"""Decide's sequence port over a Runtime (``LlamaSequence``; the text port is ``decide_text.py``).
The policy that drives it (``bmoe.decide.Decider``) imports nothing of the engine; the session
builds the adapters over its Runtime and the decider over them (docs/decide.md).

The adapter drives the runtime's own KV bookkeeping, so whatever a decision leaves in the
context is known to the next generate(). Three shortcuts keep a restored decision close to the cost of
its new tokens, all exact:
- keep in place: where the memory can be cut back to a prefix (attention-only models), a
  saved state is not copied at all. It stays in the sequence, and the KV bookkeeping copies it
  out only if something is about to remove it while it is kept (``keep``; a decision prefilled
  whole, perplexity()): an agent that only makes decisions never pays for a copy, nor holds one
  in RAM. Several kept states may live in the sequence at once, each a prefix of the next (an
  agent's prefixes, each restored and extended): before the sequence loses one, it is copied out,
  longest first;
- restore by trimming: when the sequence still holds the kept prefix followed by the last
  decision's suffix (an agent's next step), cutting the suffix off leaves exactly the kept
  state, with no copy; memory that cannot be cut (recurrent layers) takes the copy instead;
- copies reuse a buffer whose pages are already in memory, instead of faulting in new ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from bmoe.decide.errors import DecideBackendError, DecideCancelled
from bmoe.decide.port import (
    SIDE_FAILED,
    SIDE_MEMORY,
    SIDE_OFF,
    KeptPrefix,
    KeptState,
    PrefillCost,
    SideSequences,
)
from bmoe.llama.context import LlamaContext
from bmoe.runtime.forks import RowLimits, batch_limits, decode_forks, pack_calls, prefill_apart
from bmoe.runtime.runtime import Runtime, SideSequencesError
from bmoe.stream.archs import batch_apart
from bmoe.stream.stats import StreamStats

UNKNOWN_TOKEN = -1


class InSequence:
    """The data of a kept state that lives in the sequence, not in a copy: its size (what it
    holds in RAM beyond the context) is 0 until ``copy`` is made, just before the sequence
    loses it."""

    __slots__ = ("copy",)

    def __init__(self) -> None:
        self.copy: np.ndarray | None = None

    def __len__(self) -> int:
        return 0 if self.copy is None else self.copy.nbytes


class LlamaSequence:
    """The ``SequencePort`` over a Runtime's context: seq 0 and its KV bookkeeping, the states
    saved from it, and its side sequences."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._kept: tuple[KeptPrefix, ...] = ()  # what the policy keeps (``keep``): tokens, buffers in use
        self._logits: np.ndarray | None = None
        self._pool: list[np.ndarray] = []  # at most two state buffers: the kept one and a spare
        model = runtime.model
        # Attention-only memory can be cut back to any prefix; recurrent state cannot.
        self._cuttable = not (model.is_recurrent or model.is_hybrid)
        self._copy_s = 0.0  # seconds the last clear() spent copying a kept state out
        self._holding: list[KeptState] = []  # states the sequence's first tokens are, shortest first
        self._open_failed: str | None = None  # why opening the side sequences failed, once it did
        self._limits: RowLimits | None = None  # how the model's weight types bound a call (forks.py)

    @property
    def _ctx(self) -> LlamaContext:
        ctx = self._rt.ctx
        if ctx is None:
            raise DecideBackendError("decide: the session's context is closed")
        return ctx

    def keep(self, kept: Sequence[KeptPrefix]) -> None:
        self._kept = tuple(kept)

    def _is_kept(self, state: KeptState) -> bool:
        return any(k.state is state for k in self._kept)

    def n_ctx(self) -> int:
        return self._rt.n_ctx

    # --- sequence side ----------------------------------------------------------------
    def clear(self) -> float:
        self._copy_s = 0.0
        self._rt.kv.reset()
        self._logits = None
        return self._copy_s

    def prefill(self, tokens: Sequence[int], n_past: int) -> PrefillCost:
        kv = self._rt.kv
        if n_past != kv.n_past:
            raise DecideBackendError(f"decide: prefill at position {n_past} but the sequence holds {kv.n_past} tokens")
        start = self._mark()
        self._logits = kv.append(list(tokens))
        return self._cost_since(start, len(tokens))

    def _mark(self) -> tuple[float, StreamStats, int]:
        io0, dev0 = self._rt.stream_stats(), self._ctx.n_dev_tokens  # before the clock starts
        return time.perf_counter(), io0, dev0

    def _cost_since(self, start: tuple[float, StreamStats, int], n_tokens: int) -> PrefillCost:
        """What the prefill since ``start`` (a ``_mark()``) cost, with the keys of BMOE_DONE."""
        t0, io0, dev0 = start
        prefill_s = time.perf_counter() - t0
        io = self._rt.stream_stats().minus(io0)
        streaming = self._rt.stream is not None
        counted = streaming and io.cache_on
        return PrefillCost(
            n_tokens=n_tokens,
            prefill_s=prefill_s,
            read_mb=io.read_bytes / 1e6 if streaming else None,
            cache_hits=io.hits if counted else None,
            cache_misses=io.misses if counted else None,
            prefill_dev_tokens=self._ctx.n_dev_tokens - dev0 if self._rt.prefill_device is not None else None,
        )

    # --- side sequences ---------------------------------------------------------------
    def side_sequences(self) -> SideSequences:
        rt = self._rt
        if rt.side_sequences:
            return SideSequences(n_open=rt.side_sequences, n_most=rt.side_sequences)
        if rt.config.n_seq_max == 1:
            return SideSequences(n_open=0, n_most=0, why_none=SIDE_OFF)
        if self._open_failed is not None:
            return SideSequences(n_open=0, n_most=0, why_none=SIDE_FAILED, detail=self._open_failed)
        room = rt.side_room()
        return SideSequences(
            n_open=0,
            n_most=room.n,
            why_none="" if room.n else SIDE_MEMORY,
            kv_bytes=room.kv_bytes,
            room_bytes=room.room_bytes,
        )

    def open_side_sequences(self) -> int:
        """Re-create the runtime's context with the side sequences that fit now (the KV is lost,
        so the kept state must have been forgotten). A refused context leaves the session as it
        was, without side sequences, and is not tried again."""
        rt = self._rt
        if rt.side_sequences:
            return rt.side_sequences
        n = self.side_sequences().n_most
        if n < 1:
            return 0
        self.forget()
        self._logits = None
        try:
            rt.open_side_sequences(n)
        except SideSequencesError as exc:
            self._open_failed = str(exc)
        return rt.side_sequences

    def max_batch(self) -> int:
        if batch_apart(self._rt.model.arch):  # batched side by side it would not be exact: one by one
            return 1
        return max(1, self._rt.side_sequences)

    def _row_limits(self) -> RowLimits:
        if self._limits is None:
            self._limits = batch_limits(self._rt.config.model)
        return self._limits

    def _need_side_sequences(self, what: str) -> None:
        if not self._rt.side_sequences:
            raise DecideBackendError(f"decide: {what} needs side sequences and none are open")

    def prefill_batch(
        self, suffixes: Sequence[Sequence[int]], n_past: int, stop: Callable[[], bool] = lambda: False
    ) -> tuple[list[np.ndarray], PrefillCost]:
        """Each suffix on its own side sequence, forked from seq 0 (which holds the prefix and is
        left as it is), all in as few llama_decode calls as keep each suffix computed as alone.

        Each suffix must be one piece, as ``prefill`` computes it alone: llama.cpp splits a call of
        several sequences into ubatches that take as many tokens from each, which would cut
        suffixes of different lengths into other pieces (``bmoe.runtime.forks``; issue 31).
        Streamed, every ubatch reads its routed experts, so a call packs as many suffixes as fit
        one ubatch padded to the longest of them (of one width class): one graph, each routed
        expert read once for all. The pad tokens come after a suffix's last token, so by causality
        they change nothing before it; their positions are dropped with the side sequence.
        Resident, reads cost nothing and padding only costs compute: a call holds suffixes of one
        length, unpadded."""
        self._need_side_sequences("a batch")
        ctx, kv = self._ctx, self._rt.kv
        if n_past != kv.n_past:
            raise DecideBackendError(f"decide: batch at position {n_past} but the sequence holds {kv.n_past} tokens")
        if not 0 < len(suffixes) <= self.max_batch() or any(not s for s in suffixes):
            raise DecideBackendError(f"decide: a batch takes 1..{self.max_batch()} non-empty suffixes")
        pos = kv.pos_of(n_past)  # where the suffixes start: the token count, but after an image
        start = self._mark()
        rows: list[np.ndarray | None] = [None] * len(suffixes)
        calls = pack_calls(
            [len(s) for s in suffixes],
            ctx.n_ubatch,
            ctx.n_batch,
            pad=self._rt.stream is not None,
            limits=self._row_limits(),
        )
        for call in calls:
            if stop():  # between llama_decode calls: seq 0 still holds the prefix, untouched
                raise DecideCancelled("decide: the batch was cancelled between its ubatches")
            longest = max(len(suffixes[i]) for i in call)
            items = []
            try:
                for seq, i in enumerate(call, start=1):
                    toks = list(suffixes[i])
                    ctx.fork(seq)
                    items.append((seq, toks + [toks[-1]] * (longest - len(toks)), pos, len(toks) - 1))
                if longest > ctx.n_batch:  # alone in its call: in n_batch pieces, as decode() feeds it
                    ((seq, toks, _, _),) = items
                    for at in range(0, len(toks), ctx.n_batch):
                        piece = toks[at : at + ctx.n_batch]
                        row = ctx.decode_seqs([(seq, piece, pos + at, len(piece) - 1)])
                    rows[call[0]] = row[0]
                else:
                    for i, row_i in zip(call, ctx.decode_seqs(items)):
                        rows[i] = row_i
            finally:
                for seq in range(1, len(call) + 1):
                    ctx.drop(seq)
        if any(r is None for r in rows):
            raise DecideBackendError("decide: a suffix of the batch was left out of every call")
        return [r for r in rows if r is not None], self._cost_since(start, sum(len(s) for s in suffixes))

    def max_forks(self) -> int:
        return self._rt.side_sequences

    def prefill_forks(
        self, continuations: Sequence[Sequence[int]], n_past: int, base: KeptState | None = None
    ) -> tuple[list[np.ndarray], PrefillCost]:
        """Each continuation on a side sequence (``bmoe.runtime.forks``), always padded so that each
        goes in one piece: the same graph shapes resident and streamed."""
        self._need_side_sequences("scoring choices")
        if base is None and n_past != self._rt.kv.n_past:
            raise DecideBackendError(
                f"decide: choices at position {n_past} but the sequence holds {self._rt.kv.n_past} tokens"
            )
        data = None if base is None else saved_bytes(base)
        if base is not None and not isinstance(data, np.ndarray):
            raise DecideBackendError("decide: a neutral prompt state this adapter did not save")
        assert data is None or isinstance(data, np.ndarray)
        pos = self._rt.kv.pos_of(n_past) if base is None else n_past  # a neutral prompt holds no image
        start = self._mark()
        rows = decode_forks(self._ctx, continuations, pos, data, limits=self._row_limits())
        return rows, self._cost_since(start, sum(len(c) for c in continuations))

    def prefill_apart(self, tokens: Sequence[int]) -> tuple[np.ndarray, KeptState, PrefillCost]:
        self._need_side_sequences("a neutral prompt")
        start = self._mark()
        row, state = prefill_apart(self._ctx, tokens)
        return row, KeptState(data=state, n_tokens=len(tokens)), self._cost_since(start, len(tokens))

    def last_logits(self) -> np.ndarray:
        if self._logits is None:
            raise DecideBackendError("decide: no logits: nothing was prefilled")
        return self._logits

    def save_state(self) -> KeptState:
        ctx, kv = self._ctx, self._rt.kv
        n = kv.n_past
        if self._cuttable:
            # It replaces the kept state, and any copy of that goes with it: a copy is only made
            # when the sequence is about to lose a state, and this one has not lost it yet.
            self._pool = []
            state = KeptState(data=InSequence(), n_tokens=n)
        else:
            state = KeptState(data=ctx.state_bytes(out=self._spare_buffer(ctx.state_size())), n_tokens=n)
        self._hold(state)
        return state

    def _hold(self, state: KeptState) -> None:
        """The sequence's first tokens now are ``state`` exactly as it was computed (or loaded),
        so cutting the sequence back to them restores it exactly. The KV bookkeeping tells us
        before anything removes one of them; from then on only a copy can restore it. States held
        before, which the sequence has not lost (each a prefix of this one), stay held.

        Same tokens are not enough: a prompt prefilled whole computes its first tokens in a
        different piece than the kept prefix was, and llama.cpp does not round them the same."""
        self._holding = [s for s in self._holding if s.n_tokens < state.n_tokens and s is not state] + [state]
        self._guard_longest()

    def _guard_longest(self) -> None:
        if self._holding:
            self._rt.kv.guard(self._holding[-1].n_tokens, self._release_longest)
        else:
            self._rt.kv.unguard()

    def _release_longest(self) -> None:
        """The sequence is about to lose the longest held state's tokens: copy it out first (if it
        is kept and lives only in the sequence); the next shorter one is guarded next."""
        state = self._holding.pop()
        try:
            self._copy_out(state)
        finally:
            self._guard_longest()

    def _copy_out(self, state: KeptState) -> None:
        if not self._is_kept(state) or not isinstance(state.data, InSequence) or state.data.copy is not None:
            return  # dropped or replaced: not worth a copy; or already a copy
        ctx, kv = self._ctx, self._rt.kv
        n = state.n_tokens
        # Trimmed even when the bookkeeping holds n tokens: the copy must hold positions 0..n-1
        # and nothing after them, whatever a failed decode left behind.
        if not kv.trim_to(n):
            raise DecideBackendError(f"decide: cannot cut the sequence back to the kept {n}-token prefix to save it")
        del kv.tokens[n:]
        t0 = time.perf_counter()
        state.data.copy = ctx.state_bytes(out=self._spare_buffer(ctx.state_size()))
        self._copy_s += time.perf_counter() - t0

    def forget(self) -> None:
        """Nothing is kept any more: nothing in the sequence needs saving, and the state buffers
        go back to the OS."""
        self._kept = ()
        self._holding = []
        self._rt.kv.unguard()
        self._pool = []

    @property
    def held_bytes(self) -> int:
        """Bytes of state buffers this adapter holds: the kept states' copies and, on models with
        recurrent layers, the spare the next copy goes into; pool buffers with room for a longer
        prefix."""
        pooled = sum(b.nbytes for b in self._pool)
        copies = [d for k in self._kept if isinstance(d := saved_bytes(k.state), np.ndarray)]
        return pooled + sum(d.nbytes for d in copies if not any(np.shares_memory(d, b) for b in self._pool))

    def _spare_buffer(self, size: int) -> np.ndarray:
        """A pool buffer the kept state does not live in, grown (untouched pages) when too small."""
        in_use = [d for k in self._kept if isinstance(d := saved_bytes(k.state), np.ndarray)]
        busy = [b for b in self._pool if any(np.shares_memory(b, d) for d in in_use)]
        free = [b for b in self._pool if not any(b is k for k in busy)]
        buf = free[0] if free and free[0].nbytes >= size else np.empty(size + size // 4, dtype=np.uint8)
        self._pool = busy + [buf]  # headroom above: a grown prefix usually fits the same buffer
        return buf

    def load_state(self, state: KeptState) -> None:
        kv = self._rt.kv
        n = state.n_tokens
        if any(s is state for s in self._holding):
            while self._holding[-1] is not state:  # longer held states: copied out before the cut
                self._release_longest()
            if kv.n_past == n or kv.trim_to(n):
                del kv.tokens[n:]  # the sequence already is the kept state: no copy
                self._logits = None
                return
        data = saved_bytes(state)
        if data is None:
            kv.reset()
            raise DecideBackendError(f"decide: the kept {n}-token prefix state left the sequence uncopied")
        try:
            kv.reset()
            self._ctx.load_state_bytes(data)
        except Exception:
            kv.reset()
            raise
        tokens = next((k.tokens for k in self._kept if k.state is state), None)
        kv.tokens = list(tokens) if tokens is not None else [UNKNOWN_TOKEN] * n
        self._logits = None
        self._hold(state)


def saved_bytes(state: KeptState) -> np.ndarray | bytes | None:
    """The bytes of a state this adapter saved: its copy, or None while it lives only in the
    sequence."""
    data = state.data
    if isinstance(data, InSequence):
        return data.copy
    return data if isinstance(data, (np.ndarray, bytes)) else None
