"""LlamaContext: one llama.cpp context over a loaded model; its main sequence is seq 0.

It knows positions and logits, nothing of chats or decisions: the session owns which
tokens are in the KV; this class only appends, trims, saves and restores them.

A context opened with ``n_seq > 1`` also holds ``n_seq - 1`` side sequences, each with its own
KV stream of ``n_ctx`` cells (``kv_unified`` off): batched decisions fork seq 0 into them
(``fork``), prefill one suffix on each in the same ``llama_decode`` (``decode_seqs``) and drop
them (``drop``). Each stream computes exactly as a one-sequence context would.
"""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass
from typing import Iterable, Literal, Protocol, Sequence

import llama_cpp
import numpy as np

from bmoe.errors import BmoeError
from bmoe.llama.devices import ubatch_widths
from bmoe.llama.model import LlamaModel

SEQ = 0


def _u8_ptr(buf: np.ndarray) -> "ctypes._Pointer[ctypes.c_uint8]":
    return buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


class ContextError(BmoeError, RuntimeError):
    """llama.cpp refused to create a context or to decode a batch."""


@dataclass(frozen=True, slots=True)
class ContextParams:
    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_threads: int
    n_threads_batch: int
    # None = llama.cpp's auto. The references need it off (its CPU flash path rounds differently).
    flash_attn: bool | None = None
    # f32 KV cache: used by reference comparisons against transformers.
    kv_f32: bool = False
    # With a prefill device: ubatches at least this wide run there (op_offload); None: CPU only.
    offload_min_tokens: int | None = None
    # Sequences the context holds: seq 0 and n_seq - 1 side sequences, each n_ctx cells.
    n_seq: int = 1


class EvalCallback(Protocol):
    """Owns the ctypes cb_eval and abort functions (see bmoe.llama.expert_hook).

    A Python error cannot cross into C, so the callback keeps it, the abort callback stops
    llama_decode at the next node, and raise_if_failed() re-raises it here.
    """

    c_callback: object
    c_abort_callback: object

    def raise_if_failed(self) -> None: ...


class LlamaContext:
    def __init__(self, model: LlamaModel, params: ContextParams, eval_callback: EvalCallback | None = None) -> None:
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = params.n_ctx * params.n_seq  # each stream gets n_ctx cells
        cp.n_batch = params.n_batch
        cp.n_ubatch = params.n_ubatch
        cp.n_seq_max = params.n_seq
        cp.kv_unified = False  # one KV stream per sequence: a side sequence computes as seq 0 would
        cp.n_threads = params.n_threads
        cp.n_threads_batch = params.n_threads_batch
        cp.no_perf = True
        if params.flash_attn is None:
            cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
        elif params.flash_attn:
            cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        else:
            cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        if params.kv_f32:
            cp.type_k = llama_cpp.GGML_TYPE_F32
            cp.type_v = llama_cpp.GGML_TYPE_F32
        cp.op_offload = params.offload_min_tokens is not None
        self._eval_callback = eval_callback  # keep the ctypes function alive as long as the context
        if eval_callback is not None:
            cp.cb_eval = eval_callback.c_callback
            cp.cb_eval_user_data = None
            cp.abort_callback = eval_callback.c_abort_callback
            cp.abort_callback_data = None
        ptr = llama_cpp.llama_init_from_model(model.ptr, cp)
        if not ptr:
            raise ContextError(f"llama.cpp could not create a context of {params.n_ctx} tokens")
        self.ptr = ptr
        self.model = model
        self.params = params
        self.n_ctx = int(llama_cpp.llama_n_ctx_seq(ptr))  # what one sequence can hold
        self.n_seq = int(llama_cpp.llama_n_seq_max(ptr))
        self.n_batch = int(llama_cpp.llama_n_batch(ptr))
        self.mem = llama_cpp.llama_get_memory(ptr)
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.n_ubatch = int(llama_cpp.llama_n_ubatch(ptr))
        # Tokens of ubatches the prefill device ran, cumulative (callers take differences).
        self.n_dev_tokens = 0

    # --- decoding ---------------------------------------------------------------------
    def decode(
        self, tokens: Sequence[int], pos0: int, *, logits: Literal["last", "all", "none"] = "last"
    ) -> np.ndarray | None:
        """Append ``tokens`` at positions pos0.. and return logits.

        "last": the row after the last token ``# [n_vocab]``; "all": one row per token
        ``# [n_tokens, n_vocab]``; "none": nothing (no output rows are computed).
        Feeds at most n_batch tokens per llama_decode; llama.cpp splits each into ubatches.
        """
        n = len(tokens)
        if n == 0:
            raise ContextError("decode called with no tokens")
        # "all": each row copied once, straight into the result (a list of row copies stacked at
        # the end would hold every row twice at its peak)
        out = np.empty((n, self.model.n_vocab), dtype=np.float32) if logits == "all" else None
        for start in range(0, n, self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            last_chunk = start + len(chunk) == n
            self._submit(
                (
                    (
                        tok,
                        pos0 + start + i,
                        SEQ,
                        logits == "all" or (logits == "last" and last_chunk and i == len(chunk) - 1),
                    )
                    for i, tok in enumerate(chunk)
                ),
                len(chunk),
                f"llama_decode failed with code {{rc}} at position {pos0 + start}",
            )
            if out is not None:
                for i in range(len(chunk)):
                    out[start + i] = self._row_view(i)
        if self.params.offload_min_tokens is not None:
            llama_cpp.llama_synchronize(self.ptr)  # a device runs asynchronously: time ends here
        if out is not None:
            return out
        if logits == "last":
            return self._row(-1)
        return None

    def decode_seqs(self, items: Sequence[tuple[int, Sequence[int], int, int]]) -> list[np.ndarray]:
        """One ``llama_decode`` over several side sequences: ``items`` are ``(seq, tokens, pos0,
        out)``, each ``tokens`` appended to ``seq`` at ``pos0..``. Returns the logits after each
        item's token ``out`` (an index into its tokens) ``# [n_vocab]`` each, in item order. All
        tokens must fit one batch (n_batch)."""
        n = sum(len(t) for _, t, _, _ in items)
        if n == 0 or n > self.n_batch or any(not 0 <= out < len(t) for _, t, _, out in items):
            raise ContextError(f"decode_seqs takes 1..{self.n_batch} tokens and an output inside each item; got {n}")
        if any(not 0 < seq < self.n_seq for seq, _, _, _ in items):
            raise ContextError(f"decode_seqs: side sequences are 1..{self.n_seq - 1}")
        self._submit(
            ((tok, pos0 + i, seq, i == out) for seq, tokens, pos0, out in items for i, tok in enumerate(tokens)),
            n,
            f"llama_decode of {len(items)} sequences failed with code {{rc}}",
        )
        if self.params.offload_min_tokens is not None:
            llama_cpp.llama_synchronize(self.ptr)
        # the output rows are the items' outputs, in batch order
        outs = list(itertools.accumulate((len(t) for _, t, _, _ in items), initial=0))
        return [self._row(start + out) for start, (_, _, _, out) in zip(outs, items)]

    def decode_seqs_rows(self, items: Sequence[tuple[int, Sequence[int], int, int]]) -> list[np.ndarray]:
        """Like ``decode_seqs``, but the 4th field of an item is ``n_out``: the logits after each of
        its first ``n_out`` tokens come back, ``# [n_out, n_vocab]`` per item (a multi-token choice
        is scored at every one of its positions; padding after it is not read)."""
        n = sum(len(t) for _, t, _, _ in items)
        if n == 0 or n > self.n_batch or any(not 0 < n_out <= len(t) for _, t, _, n_out in items):
            raise ContextError(f"decode_seqs_rows takes 1..{self.n_batch} tokens and 1..len outputs per item; got {n}")
        if any(not 0 < seq < self.n_seq for seq, _, _, _ in items):
            raise ContextError(f"decode_seqs_rows: side sequences are 1..{self.n_seq - 1}")
        self._submit(
            ((tok, pos0 + i, seq, i < n_out) for seq, tokens, pos0, n_out in items for i, tok in enumerate(tokens)),
            n,
            f"llama_decode of {len(items)} sequences failed with code {{rc}}",
        )
        if self.params.offload_min_tokens is not None:
            llama_cpp.llama_synchronize(self.ptr)
        starts = itertools.accumulate((len(t) for _, t, _, _ in items), initial=0)  # batch index of each item
        return [
            np.stack([self._row(start + j) for j in range(n_out)]) for start, (_, _, _, n_out) in zip(starts, items)
        ]

    def _submit(self, entries: Iterable[tuple[int, int, int, bool]], n: int, failure: str) -> None:
        """Fill the batch with ``n`` entries ``(token, pos, seq, wants_logits)`` and run one
        llama_decode; ``failure`` (with ``{rc}``) is the message when llama.cpp refuses it."""
        b = self._batch
        b.n_tokens = n
        for k, (tok, pos, seq, want) in enumerate(entries):
            b.token[k] = int(tok)
            b.pos[k] = pos
            b.n_seq_id[k] = 1
            b.seq_id[k][0] = seq
            b.logits[k] = 1 if want else 0
        rc = llama_cpp.llama_decode(self.ptr, b)
        self.after_decode(rc, failure.format(rc=rc))
        self.n_dev_tokens += self._device_tokens(n)

    def after_decode(self, rc: int, failure: str) -> None:
        """What follows every decode of this context (tokens here, an image's embeddings in
        bmoe.llama.mtmd): the streaming hook's own failure first, then llama.cpp's return code
        (``failure`` is the message when it is not 0)."""
        if self._eval_callback is not None:
            self._eval_callback.raise_if_failed()  # an aborted decode's logits are garbage
        if rc != 0:
            raise ContextError(failure)

    def _device_tokens(self, n_chunk: int) -> int:
        """Tokens of one llama_decode call that the prefill device ran: its ubatches at least
        offload_min_tokens wide (the threshold open_prefill_device checked the device keeps)."""
        if self.params.offload_min_tokens is None:
            return 0
        widths = ubatch_widths(n_chunk, n_chunk, self.n_ubatch)
        return sum(w for w in widths if w >= self.params.offload_min_tokens)

    def _row(self, i: int) -> np.ndarray:
        return self._row_view(i).copy()

    def _row_view(self, i: int) -> np.ndarray:
        """Output row ``i`` in llama.cpp's own buffer ``# [n_vocab]``: valid until the next decode."""
        ptr = llama_cpp.llama_get_logits_ith(self.ptr, i)
        if not ptr:
            raise ContextError(f"no logits for output row {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))

    # --- memory -----------------------------------------------------------------------
    def clear(self) -> None:
        # Metadata only: wiping the buffers costs ~10 ms at n_ctx 4096 and changes nothing, since
        # empty cells are masked out (their finite leftovers get exactly zero weight).
        llama_cpp.llama_memory_clear(self.mem, False)

    def trim(self, n_keep: int) -> bool:
        """Drop positions >= n_keep. False where the memory cannot be cut (recurrent layers)."""
        return bool(llama_cpp.llama_memory_seq_rm(self.mem, SEQ, n_keep, -1))

    def fork(self, dst: int) -> None:
        """Make side sequence ``dst`` a copy of seq 0 (its whole KV and recurrent state)."""
        llama_cpp.llama_memory_seq_cp(self.mem, SEQ, dst, -1, -1)

    def side_state_bytes(self, seq: int) -> np.ndarray:
        """The whole state of side sequence ``seq`` ``# [nbytes] uint8``, in new memory."""
        size = int(llama_cpp.llama_state_seq_get_size(self.ptr, seq))
        buf = np.empty(size, dtype=np.uint8)
        written = int(llama_cpp.llama_state_seq_get_data(self.ptr, _u8_ptr(buf), size, seq))
        if written != size:
            raise ContextError(f"side sequence {seq} state copy wrote {written} of {size} bytes")
        return buf

    def load_side_state(self, seq: int, state: np.ndarray) -> None:
        """Replace side sequence ``seq`` with a state ``side_state_bytes`` saved (seq 0 untouched)."""
        self.drop(seq)
        if int(llama_cpp.llama_state_seq_set_data(self.ptr, _u8_ptr(state), state.nbytes, seq)) == 0:
            raise ContextError(f"llama.cpp refused the saved state for side sequence {seq}")

    def drop(self, seq: int) -> None:
        """Empty side sequence ``seq``."""
        llama_cpp.llama_memory_seq_rm(self.mem, seq, -1, -1)

    def state_size(self) -> int:
        return int(llama_cpp.llama_state_seq_get_size(self.ptr, SEQ))

    def state_bytes(self, out: np.ndarray | None = None) -> np.ndarray:
        """The whole sequence state (KV and recurrent state) ``# [nbytes] uint8``, copied once
        into ``out`` (a uint8 buffer at least that large, reused by the caller) or into new memory."""
        size = self.state_size()
        if out is None:
            out = np.empty(size, dtype=np.uint8)
        elif out.nbytes < size:
            raise ContextError(f"state buffer of {out.nbytes} bytes is smaller than the {size}-byte state")
        buf = out[:size]
        written = int(llama_cpp.llama_state_seq_get_data(self.ptr, _u8_ptr(buf), size, SEQ))
        if written != size:
            raise ContextError(f"sequence state copy wrote {written} of {size} bytes")
        return buf

    def load_state_bytes(self, state: np.ndarray | bytes) -> None:
        self.clear()
        buf = np.frombuffer(state, dtype=np.uint8) if isinstance(state, bytes) else state
        read = int(llama_cpp.llama_state_seq_set_data(self.ptr, _u8_ptr(buf), buf.nbytes, SEQ))
        if read == 0:
            raise ContextError("llama.cpp refused the saved sequence state")

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.ptr)
            self.ptr = None
