"""One-time llama.cpp process setup: backend init and log routing.

llama.cpp logs every tensor at load; bmoe keeps stderr quiet unless BMOE_LLAMA_LOG=1,
so that stdout/stderr stay readable for people and for the line protocol.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

import llama_cpp

_init_lock = threading.Lock()
_initialised = False
_log_cb = None  # kept alive: llama.cpp holds the pointer for the process lifetime

GGML_LOG_LEVEL_ERROR = 4


def _make_log_callback() -> object:
    verbose = os.environ.get("BMOE_LLAMA_LOG", "") not in ("", "0")

    @llama_cpp.llama_log_callback
    def _cb(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        if verbose or level >= GGML_LOG_LEVEL_ERROR:
            sys.stderr.write(text.decode("utf-8", errors="replace"))

    return _cb


def ensure_backend() -> None:
    """Initialise llama.cpp once per process (idempotent, thread-safe)."""
    global _initialised, _log_cb
    with _init_lock:
        if _initialised:
            return
        _log_cb = _make_log_callback()
        llama_cpp.llama_log_set(_log_cb, None)
        llama_cpp.llama_backend_init()
        _initialised = True


def library_version() -> str:
    return str(getattr(llama_cpp, "__version__", "unknown"))
