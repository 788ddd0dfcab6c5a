"""ExpertHook: the cb_eval callback that makes llama.cpp compute on streamed experts.

It asks only for the nodes it needs: each layer's routing node (``ffn_moe_topk-<il>``, or
``ffn_moe_weights-<il>`` with slots, whose ids it rewrites to slot numbers), the node before a
deferred projection's matmul (split phase), and ``l_out-<l>`` / ``ffn_inp-<l>`` for read-ahead.
On an expert matmul's ask call it rebinds the stacked weight (``src[0]`` of MUL_MAT_ID) onto the
streamer's buffer, once for the model's life. An exception cannot cross the C boundary: it is
kept as the sticky ``error``, the abort callback stops ``llama_decode``, and ``raise_if_failed``
re-raises it in the session's thread. docs/streaming.md ("How it works", "Split-phase reads",
"Speculative prefetch", "Slots") describes each step and why.
"""

from __future__ import annotations

import ctypes
import time
from typing import Collection, Protocol, Sequence

import llama_cpp
import numpy as np

from bmoe.errors import EngineFailure
from bmoe.llama.ggml_tensor import (
    DATA_OFFSET,
    GGML_TYPE_I32,
    NAME_OFFSET,
    SRC_OFFSET,
    GgmlBase,
    GgmlTensor,
    check_tensor,
    self_check,
)
from bmoe.stream.archs import WEIGHTS_NODE, ArchEntry
from bmoe.stream.streamer import Binding

_MOE_PREFIX = b"ffn_moe_"
GGML_TYPE_F32 = 0
_N_SRC_CHECKED = 3  # MUL_MAT_ID: weights, activations, ids
_OP_OFFSET = GgmlTensor.op.offset


def _op_code(lib: ctypes.CDLL, name: bytes) -> int:
    """ggml's enum value of the op called ``name`` (ggml_op_name walks the enum until NULL)."""
    for i in range(512):
        n = lib.ggml_op_name(i)
        if n is None:
            break
        if n == name:
            return i
    raise HookError(f"ggml has no op named {name.decode()}")


class StreamerPort(Protocol):
    def binding(self, name: str) -> Binding | None: ...
    def bindings(self) -> tuple[Binding, ...]: ...
    def on_route(self, il: int, expert_ids: np.ndarray) -> None: ...
    def set_schedule(self, il: int, order: Sequence[str], deferred: Collection[str] = ()) -> None: ...
    @property
    def pending(self) -> tuple[str, ...]: ...
    def wait(self, proj: str) -> None: ...
    def drain(self) -> None: ...
    def prefetch(self, il: int, experts: np.ndarray, *, early: bool = False) -> None: ...
    @property
    def two_deep(self) -> bool: ...
    @property
    def slots(self) -> bool: ...
    def slot_map(self, il: int) -> np.ndarray: ...


class GuessPort(Protocol):
    @property
    def n_embd(self) -> int: ...
    def can_guess(self, il: int) -> bool: ...
    def guess(self, il: int, h: np.ndarray) -> np.ndarray: ...  # h: [n_tokens, n_embd]


class HookError(EngineFailure):
    """The hook met a graph it cannot stream safely (sticky; llama_decode is aborted)."""


def _sticky(exc: BaseException) -> EngineFailure:
    """What the hook keeps of an exception it caught: an EngineFailure as it is, anything else
    (a KeyboardInterrupt, a bug) as a HookError caused by it. The error stays set for the
    context's life (every later decode is aborted), and an interrupt may have stopped the
    streamer half-way through a route's bookkeeping, so it is the session's sticky failure,
    never a request's own error that would come back on every later request."""
    if isinstance(exc, EngineFailure):
        return exc
    what = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
    err = HookError(
        f"the streaming hook was {what} inside llama_decode ({type(exc).__name__}"
        + (f": {exc}" if str(exc) else "")
        + "); the expert cache may be half-updated"
    )
    err.__cause__ = exc
    return err


class ExpertHook:
    def __init__(
        self,
        streamer: StreamerPort,
        entry: ArchEntry,
        ggml: GgmlBase | None = None,
        *,
        overlap: bool = True,
        guess: GuessPort | None = None,
    ) -> None:
        self.ggml = self_check(ggml)  # GgmlLayoutError here: streaming is refused before any load
        lib = self.ggml.lib  # for ids a prefill device computed (see _ids_words)
        lib.ggml_backend_buffer_is_host.restype, lib.ggml_backend_buffer_is_host.argtypes = (
            ctypes.c_bool,
            [ctypes.c_void_p],
        )
        lib.ggml_backend_tensor_get.restype = None
        lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        self.streamer = streamer
        self.entry = entry
        self._mul_mat_id = _op_code(lib, b"MUL_MAT_ID")
        # Slots (SlotCache): the route is taken where the ids have gathered the routing weights
        # and no expert matmul has read them yet, and renumbered to slots there.
        self.slots = bool(streamer.slots)
        self._route_prefix = ((WEIGHTS_NODE if self.slots else entry.route_node) + "-").encode()
        self._renumbered: set[int] = set()  # layers whose ids this graph renumbered (slots)
        self._route_il: dict[bytes, int] = {}  # route node name -> its layer
        self._name_probe = max(len(self._route_prefix), len(_MOE_PREFIX))
        self._checked: set[int] = set()  # weight pointers already looked at
        self._bound: dict[str, int] = {}  # tensor name -> address it now points to
        self._n_bindings = len(streamer.bindings())
        # Until every streamed weight is bound, any ffn_moe_* node is looked at, not only MUL_MAT_ID.
        self._unbound = self._n_bindings > 0
        self.error: EngineFailure | None = None
        # Split phase: what the first graph taught us, per layer.
        self.overlap = overlap
        self._layer_projs: dict[int, frozenset[str]] = {}
        for b in streamer.bindings():
            self._layer_projs[b.il] = self._layer_projs.get(b.il, frozenset()) | {b.proj}
        self._weights: dict[int, tuple[int, str]] = {}  # bound weight pointer -> (layer, projection)
        self._seen: dict[int, dict[str, bytes]] = {}  # layer -> projection -> name of the node before its first matmul
        self._stop_of: dict[int, tuple[str, bytes]] = {}  # layer -> (deferred projection, its stop node name + NUL)
        self._learning = overlap and bool(self._layer_projs)
        self._prev = 0  # the node of the previous ask call
        self._stops: list[tuple[bytes, str]] = []  # pending deferred phases: (stop name + NUL, projection)
        self._stop_node = 0  # the node we answered True for, to wait in its data call
        # Speculative prefetch: "l_out-<l>" + NUL -> l+1, for every l+1 that streams and can be guessed.
        self.guess = guess
        self._out_prefix = (entry.out_node + "-").encode()
        self._next: dict[bytes, int] = {}
        if guess is not None:
            self._next = {f"{entry.out_node}-{il - 1}".encode(): il for il in self._layer_projs if guess.can_guess(il)}
        self._last_layer = max(self._layer_projs, default=-1)
        self._first_layer = min(self._layer_projs, default=-1)
        self._out_node = 0  # the l_out node we answered True for
        # Early guess: "<inp_node>-<l>" + NUL -> (l, the next streamed layer) where that one is guessed.
        self._early: dict[bytes, tuple[int, int]] = {}
        if guess is not None and streamer.two_deep:
            ls = sorted(self._layer_projs)
            self._early = {f"{entry.inp_node}-{a}".encode(): (a, b) for a, b in zip(ls, ls[1:]) if guess.can_guess(b)}
        self._inp_prefix = (entry.inp_node + "-").encode()
        self._name_probe = max(self._name_probe, len(self._out_prefix), len(self._inp_prefix))
        self._inp: dict[int, tuple[int, int]] = {}  # layer -> (its inp node in this graph, next layer)
        self.inp_found: set[int] = set()  # layers whose inp node some graph had
        # Python cost counters (seconds are wall time inside the callbacks).
        self.n_calls = 0
        self.n_routes = 0
        self.n_stop_waits = 0  # deferred projections waited for in their stop node's data call
        self.n_late_waits = 0  # ... waited for in their matmul's ask instead (the stop node did not come)
        self.callback_s = 0.0  # all time in the callback, the streamer's included
        self.route_s = 0.0  # time in the streamer (on_route, waits): reads waited for and cache bookkeeping
        self.n_prefetches = 0  # guesses queued ahead of their route (early ones included)
        self.n_wide_prefetches = 0  # ... of them in a ubatch of more than one token (prefill read-ahead)
        self.n_early_prefetches = 0  # ... of them made at the previous layer's route (two layers deep)
        self.guess_s = 0.0  # time computing the guesses (part of python_s)
        # Kept on self: llama.cpp holds raw pointers to these for the context's life.
        self.c_callback = llama_cpp.ggml_backend_sched_eval_callback(self._callback)
        self.c_abort_callback = llama_cpp.ggml_abort_callback(self._abort)

    # --- what the session reads ---------------------------------------------------------
    @property
    def bound(self) -> dict[str, int]:
        return dict(self._bound)

    @property
    def python_s(self) -> float:
        """Callback time that is not the streamer's: the Python price of driving llama.cpp."""
        return self.callback_s - self.route_s

    def raise_if_failed(self) -> None:
        """After llama_decode: nothing may be left in flight; re-raise the sticky error if any."""
        self._stops.clear()
        self._inp.clear()  # node addresses of a graph that is gone
        self._renumbered.clear()
        self._stop_node = self._prev = self._out_node = 0
        if self.error is None:
            try:
                self.streamer.drain()  # normally nothing: every deferred read was waited for before its matmul
            except BaseException as exc:  # noqa: BLE001 - a read that failed after the last wait point
                self.error = _sticky(exc)
        if self.error is not None:
            raise self.error

    # --- callbacks ----------------------------------------------------------------------
    def _abort(self, _data: object) -> bool:
        return self.error is not None

    def _callback(self, t: int | None, ask: bool, _user: object) -> bool:
        t0 = time.perf_counter()
        self.n_calls += 1
        try:
            if t is None or self.error is not None:
                return False
            if ask:
                prev, self._prev = self._prev, t
                head = ctypes.string_at(t + NAME_OFFSET, self._name_probe)
                if head.startswith(self._route_prefix):
                    # "ffn_moe_weights-<il>" exactly: ggml names its reshapes "<name> (reshaped)"
                    return not self.slots or GgmlTensor.from_address(t).name[len(self._route_prefix) :].isdigit()
                if self._next and head.startswith(self._out_prefix) and self._wants_prefetch(t):
                    self._out_node = t
                    return True
                if self._early and head.startswith(self._inp_prefix):
                    pair = self._early.get(GgmlTensor.from_address(t).name)
                    if pair is not None:
                        self._inp[pair[0]] = (t, pair[1])
                        self.inp_found.add(pair[0])
                    return False
                if ctypes.c_int.from_address(t + _OP_OFFSET).value == self._mul_mat_id or (
                    self._unbound and head.startswith(_MOE_PREFIX)
                ):
                    self._matmul(t, prev)
                if self._stops:
                    stop = self._stops[0][0]
                    if ctypes.string_at(t + NAME_OFFSET, len(stop)) == stop:
                        self._stop_node = t
                        return True
                return False
            if t == self._stop_node:
                self._stop_node = 0
                _, proj = self._stops.pop(0)
                self._streamer_call(self.streamer.wait, proj)
                self.n_stop_waits += 1
                return True
            if t == self._out_node:
                self._out_node = 0
                self._prefetch(t)
                return True
            self._route(t)
            return True
        except BaseException as exc:  # noqa: BLE001 - must not unwind into C
            if self.error is None:
                self.error = _sticky(exc)
            self._stops.clear()
            self._stop_node = self._out_node = 0
            try:
                self.streamer.drain()  # nothing may still write into a buffer a node might read
            except BaseException:  # noqa: BLE001 - the first error is the one reported
                pass
            # A data call answering False ends the split here (so the matmul after a failed wait
            # never runs); in an ask, the abort callback stops the graph after the next node.
            return ask
        finally:
            self.callback_s += time.perf_counter() - t0

    def _wants_prefetch(self, t: int) -> bool:
        """``t`` is an ``l_out-*`` node: one whose next layer is guessed, with rows that fit."""
        s = GgmlTensor.from_address(t)
        il = self._next.get(s.name)
        return il is not None and self._guessable(s, il)

    def _guessable(self, s: GgmlTensor, il: int) -> bool:
        """``s`` holds f32 rows of n_embd, one per token of the ubatch, from which layer ``il`` can
        be guessed: several rows only if ``il`` is not the last streamed layer."""
        n_tokens = int(s.ne[1])
        return (
            s.type == GGML_TYPE_F32
            and n_tokens >= 1
            and s.ne[2] == 1
            and s.ne[3] == 1
            and s.nb[0] == 4
            and s.ne[0] == self.guess.n_embd  # type: ignore[union-attr]
            and (n_tokens == 1 or (il != self._last_layer and s.nb[1] >= 4 * s.ne[0] and s.nb[1] % 4 == 0))
        )

    def _prefetch(self, t: int, il: int | None = None) -> None:
        """Guess layer ``il`` (by default the layer after the ``l_out`` node ``t``) from ``t``'s rows
        and queue its reads."""
        s = GgmlTensor.from_address(t)
        if not self.ggml.lib.ggml_backend_buffer_is_host(s.buffer):
            return  # computed elsewhere: no guess (a prefill device decodes on the CPU anyway)
        early = il is not None
        if il is None:
            il = self._next[s.name]
        g0 = time.perf_counter()
        n_embd, n_tokens, row = int(s.ne[0]), int(s.ne[1]), int(s.nb[1])
        words = (ctypes.c_float * ((n_tokens - 1) * row // 4 + n_embd)).from_address(s.data)
        h = np.ndarray((n_tokens, n_embd), np.float32, words, strides=(row, 4))  # type: ignore[arg-type]  # [n_tokens, n_embd], in place
        ids = self.guess.guess(il, h)  # type: ignore[union-attr]
        self.guess_s += time.perf_counter() - g0
        self._streamer_call(self.streamer.prefetch, il, ids, early=early)
        self.n_prefetches += 1
        self.n_wide_prefetches += int(n_tokens > 1)
        self.n_early_prefetches += int(early)

    def _streamer_call(self, fn, *args, **kw) -> None:  # noqa: ANN001
        r0 = time.perf_counter()
        try:
            fn(*args, **kw)
        finally:
            self.route_s += time.perf_counter() - r0

    def _matmul(self, node: int, prev: int) -> None:
        """``node`` is a MUL_MAT_ID (or, until every streamed weight is bound, any ``ffn_moe_*``
        node): bind the streamed weights among its sources; if it reads one, check its layer was
        renumbered (slots), learn from it (first graph) and make sure that projection is not still
        being read (any graph)."""
        self._bind_sources(node)
        key = self._weights.get(ctypes.c_void_p.from_address(node + SRC_OFFSET).value or 0)
        if key is None:
            return
        if self.slots and key[0] not in self._renumbered:
            raise HookError(
                f"layer {key[0]}'s expert matmul came before its {self._route_prefix.decode()}{key[0]} "
                "node, where the routed ids are renumbered to slots; refusing to compute it"
            )
        if self._learning or self._stops:
            self._consumer(node, prev, key)

    def _consumer(self, node: int, prev: int, key: tuple[int, str]) -> None:
        il, proj = key
        if self._learning:
            self._learn(il, proj, prev)
        for i, (_, p) in enumerate(self._stops):
            if p == proj:  # its stop node did not come before it: wait here, before the range is computed
                del self._stops[i]
                self._streamer_call(self.streamer.wait, proj)
                self.n_late_waits += 1
                break

    def _learn(self, il: int, proj: str, prev: int) -> None:
        seen = self._seen.setdefault(il, {})
        if proj in seen:
            return
        seen[proj] = GgmlTensor.from_address(prev).name if prev else b""  # insertion order = graph order
        if set(seen) != self._layer_projs.get(il):
            return
        order = list(seen)
        last, stop = order[-1], seen[order[-1]]
        # Defer the last-consumed projection if some other matmul comes before it and its stop node
        # is a named node after the routing node (not the routing node itself: nothing to overlap).
        if len(order) > 1 and stop and not stop.startswith(self._route_prefix):
            self._stop_of[il] = (last, stop + b"\0")
            self.streamer.set_schedule(il, order, (last,))
        if len(self._seen) == len(self._layer_projs) and all(
            set(v) == self._layer_projs[k] for k, v in self._seen.items()
        ):
            self._learning = False

    def _bind_sources(self, node: int) -> None:
        for i in range(_N_SRC_CHECKED):
            src = ctypes.c_void_p.from_address(node + SRC_OFFSET + 8 * i).value
            if not src or src in self._checked:
                continue
            self._checked.add(src)
            name = GgmlTensor.from_address(src).name.decode("utf-8", "replace")
            b = self.streamer.binding(name)
            if b is None:
                continue
            check_tensor(self.ggml, src)  # the view agrees with libggml on this very tensor
            if self.ggml.nbytes(src) != b.nbytes:
                raise HookError(
                    f"{name} is {self.ggml.nbytes(src)} bytes in llama.cpp but {b.nbytes} in the GGUF "
                    "layout; refusing to stream it"
                )
            if b.n_slots:
                w = GgmlTensor.from_address(src)
                if w.ne[3] != 1 or w.ne[2] < 1 or w.nb[2] * w.ne[2] != b.nbytes or w.nb[2] > b.expert_stride:
                    raise HookError(
                        f"{name} (ne {tuple(w.ne)}, nb {tuple(w.nb)}) does not fit slots of "
                        f"{b.expert_stride} bytes; refusing to stream it"
                    )
                w.ne[2], w.nb[2], w.nb[3] = b.n_slots, b.expert_stride, b.expert_stride * b.n_slots
            ctypes.c_void_p.from_address(src + DATA_OFFSET).value = b.data_addr
            self._bound[name] = b.data_addr
            self._weights[src] = (b.il, b.proj)
            self._unbound = len(self._bound) < self._n_bindings

    def _ids_words(self, t: int, s: GgmlTensor, n_words: int) -> ctypes.Array:
        """The view's words: in place on the host, copied out when a prefill device computed them
        (its ``data`` is then an address on the device, not in this process)."""
        lib = self.ggml.lib
        if lib.ggml_backend_buffer_is_host(s.buffer):
            return (ctypes.c_int32 * n_words).from_address(s.data)
        out = (ctypes.c_int32 * n_words)()
        lib.ggml_backend_tensor_get(t, out, 0, 4 * n_words)
        return out

    def _layer_of(self, node: GgmlTensor) -> int:
        name = node.name
        il = self._route_il.get(name)
        if il is None:
            il = self._route_il[name] = int(name[len(self._route_prefix) :])
        return il

    def _route(self, t: int) -> None:
        node = GgmlTensor.from_address(t)
        il = self._layer_of(node)
        if self.slots:  # the gathered weights: get_rows(probs, ids), the ids its second source
            t = ctypes.c_void_p.from_address(t + SRC_OFFSET + 8).value or 0
            if not t:
                raise HookError(f"{node.name!r} has no ids source; cannot renumber it to slots")
        if il == self._first_layer:
            self._renumbered.clear()  # a new graph (each ubatch of a llama_decode is one)
        s = GgmlTensor.from_address(t) if self.slots else node
        k, n_tokens = int(s.ne[0]), int(s.ne[1])
        if s.type != GGML_TYPE_I32 or s.nb[0] != 4 or s.ne[2] != 1 or s.ne[3] != 1:
            raise HookError(
                f"{s.name!r} is not an int32 [n_expert_used, n_tokens] tensor "
                f"(type {s.type}, ne {tuple(s.ne)}, nb {tuple(s.nb)})"
            )
        if n_tokens == 0:
            # The last layer runs only the output rows; a ubatch with none (an inner piece of a
            # prefill split into several ubatches) routes nothing there.
            self._renumbered.add(il)
            return
        row = int(s.nb[1])
        if self.slots and not self.ggml.lib.ggml_backend_buffer_is_host(s.buffer):
            raise HookError(f"the ids of layer {il} were computed off the host; slots renumber them in place")
        # The ids are a view into the argsort result: rows are nb[1] bytes apart, not k*4.
        words = self._ids_words(t, s, (n_tokens - 1) * row // 4 + k)
        live = np.ndarray((n_tokens, k), np.int32, words, strides=(row, 4))  # type: ignore[arg-type]  # [n_tokens, k], in place
        ids = live.copy()
        self._stops.clear()
        try:
            self._streamer_call(self.streamer.on_route, il, ids)
        finally:
            self.n_routes += 1
        if self.slots:
            slots = self.streamer.slot_map(il)[ids]
            if slots.size and slots.min() < 0:
                raise HookError(f"layer {il}: routed experts {sorted(set(ids[slots < 0].tolist()))} have no slot")
            live[...] = slots
            self._renumbered.add(il)
        deferred = self._stop_of.get(il)
        if deferred is not None and deferred[0] in self.streamer.pending:
            self._stops.append((deferred[1], deferred[0]))
        inp, nxt = self._inp.pop(il, (0, 0))
        if inp and n_tokens > 1 and self._guessable(GgmlTensor.from_address(inp), nxt):
            self._prefetch(inp, nxt)  # not in decode: its matmuls are too short to read behind (module)
