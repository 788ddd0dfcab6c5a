"""ExpertHook: the cb_eval callback that makes llama.cpp compute on streamed experts.

ggml's scheduler calls ``cb_eval(t, ask=True)`` for each graph node before computing it;
answering True for a node makes it compute everything up to that node, synchronise, and call
``cb_eval(t, ask=False)`` with the node's data. The hook

- answers True only for the routing nodes ``ffn_moe_topk-<il>``; on their data call it reads
  the selected expert ids ``# [n_tokens, n_expert_used]`` and calls ``streamer.on_route``;
- on the ask call of an expert matmul node (``ffn_moe_*``), which comes before that node is
  computed, rebinds the stacked expert weight among its sources (``src[0]`` of MUL_MAT_ID)
  onto the streamer's buffer. Weight tensors belong to the model, so a rebind lasts for the
  model's life and later graphs (any ubatch size) reuse it.

A Python exception cannot cross the C boundary: it is kept as the sticky ``error``; the
``c_abort_callback`` (wire it as the context's abort callback) then stops llama_decode, which
returns 2, and ``raise_if_failed()`` re-raises it in the session's thread.
"""
from __future__ import annotations

import ctypes
import time
from typing import Protocol

import llama_cpp
import numpy as np

from ..stream.archs import ArchEntry
from ..stream.streamer import Binding
from .ggml_tensor import DATA_OFFSET, GGML_TYPE_I32, NAME_OFFSET, SRC_OFFSET, GgmlBase, GgmlTensor, check_tensor, self_check

_MOE_PREFIX = b"ffn_moe_"
_N_SRC_CHECKED = 3  # MUL_MAT_ID: weights, activations, ids


class StreamerPort(Protocol):
    def binding(self, name: str) -> Binding | None: ...
    def on_route(self, il: int, expert_ids: np.ndarray) -> None: ...


class HookError(RuntimeError):
    """The hook met a graph it cannot stream safely (sticky; llama_decode is aborted)."""


class ExpertHook:
    def __init__(self, streamer: StreamerPort, entry: ArchEntry, ggml: GgmlBase | None = None) -> None:
        self.ggml = self_check(ggml)  # GgmlLayoutError here: streaming is refused before any load
        lib = self.ggml.lib  # for ids a prefill device computed (see _ids_words)
        lib.ggml_backend_buffer_is_host.restype, lib.ggml_backend_buffer_is_host.argtypes = ctypes.c_bool, [ctypes.c_void_p]
        lib.ggml_backend_tensor_get.restype = None
        lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        self.streamer = streamer
        self.entry = entry
        self._route_prefix = (entry.route_node + "-").encode()
        self._name_probe = max(len(self._route_prefix), len(_MOE_PREFIX))
        self._checked: set[int] = set()          # weight pointers already looked at
        self._bound: dict[str, int] = {}         # tensor name -> address it now points to
        self.error: BaseException | None = None
        # Python cost counters (seconds are wall time inside the callbacks).
        self.n_calls = 0
        self.n_routes = 0
        self.callback_s = 0.0   # all time in the callback, on_route included
        self.route_s = 0.0      # time in streamer.on_route (reads and cache bookkeeping)
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
                head = ctypes.string_at(t + NAME_OFFSET, self._name_probe)
                if head.startswith(self._route_prefix):
                    return True
                if head.startswith(_MOE_PREFIX):
                    self._bind_sources(t)
                return False
            self._route(t)
            return True
        except BaseException as exc:  # noqa: BLE001 - must not unwind into C
            if self.error is None:
                self.error = exc
            return True  # keep going: the abort callback stops the very next node
        finally:
            self.callback_s += time.perf_counter() - t0

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
                raise HookError(f"{name} is {self.ggml.nbytes(src)} bytes in llama.cpp but {b.nbytes} in the GGUF "
                                "layout; refusing to stream it")
            ctypes.c_void_p.from_address(src + DATA_OFFSET).value = b.data_addr
            self._bound[name] = b.data_addr

    def _ids_words(self, t: int, s: GgmlTensor, n_words: int) -> ctypes.Array:
        """The view's words: in place on the host, copied out when a prefill device computed them
        (its ``data`` is then an address on the device, not in this process)."""
        lib = self.ggml.lib
        if lib.ggml_backend_buffer_is_host(s.buffer):
            return (ctypes.c_int32 * n_words).from_address(s.data)
        out = (ctypes.c_int32 * n_words)()
        lib.ggml_backend_tensor_get(t, out, 0, 4 * n_words)
        return out

    def _route(self, t: int) -> None:
        s = GgmlTensor.from_address(t)
        il = int(s.name[len(self._route_prefix):])
        k, n_tokens = int(s.ne[0]), int(s.ne[1])
        if s.type != GGML_TYPE_I32 or s.nb[0] != 4 or s.ne[2] != 1 or s.ne[3] != 1:
            raise HookError(f"{s.name!r} is not an int32 [n_expert_used, n_tokens] tensor "
                            f"(type {s.type}, ne {tuple(s.ne)}, nb {tuple(s.nb)})")
        if n_tokens == 0:
            # The last layer runs only the output rows; a ubatch with none (an inner piece of a
            # prefill split into several ubatches) routes nothing there.
            return
        row = int(s.nb[1])
        # The ids are a view into the argsort result: rows are nb[1] bytes apart, not k*4.
        flat = np.ctypeslib.as_array(self._ids_words(t, s, (n_tokens - 1) * row // 4 + k))
        ids = np.lib.stride_tricks.as_strided(flat, shape=(n_tokens, k), strides=(row, 4)).copy()  # [n_tokens, k]
        r0 = time.perf_counter()
        try:
            self.streamer.on_route(il, ids)
        finally:
            self.route_s += time.perf_counter() - r0
            self.n_routes += 1
