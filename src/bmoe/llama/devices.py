"""The devices llama.cpp's scheduler can use, and the prefill device a session asks for.

A prefill device never holds the model: the layers stay on the host (``n_gpu_layers`` 0) and the
context's ``op_offload`` lets ggml's scheduler run an op that reads host weights on a device whose
backend says ``offload_op`` for it (CUDA, Vulkan, Metal, SYCL: batch >= a threshold fixed when the
backend registers, ``GGML_OP_OFFLOAD_MIN_BATCH``, default 32), copying the weights per graph. So a
ubatch at least that wide runs on the device, a narrower one (decode, a short tail) on the CPU.

bmoe does not take the threshold on trust: ``open_prefill_device`` asks the device's own
``offload_op`` about matmuls of every width it needs and refuses a device whose rule is not
"from exactly ``min_tokens`` on". That is what makes ``prefill_dev_tokens`` a count, not a guess.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable

import llama_cpp  # noqa: F401 - maps libggml first, so the sonames below resolve to that copy

from bmoe.errors import BmoeError, ConfigError

# The threshold CUDA/Vulkan/Metal/SYCL read once, when their backend registers.
THRESHOLD_ENV = "GGML_OP_OFFLOAD_MIN_BATCH"
# Widest matmul the probe asks about; a device that offloads nothing up to here is no prefill device.
PROBE_MAX_TOKENS = 1 << 16

_TYPE_NAMES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}
_GGML_TYPE_F32 = 0


class PrefillDeviceError(ConfigError):
    """The prefill device asked for is missing or cannot serve as one; refused at startup."""


class GgmlLibraryError(BmoeError, RuntimeError):
    """llama_cpp's own ggml library is not mapped in this process, so devices cannot be listed."""


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    name: str  # what --prefill-device takes: CPU, CUDA0, Vulkan0, RPC0, ...
    kind: str  # cpu | gpu | igpu | accel
    description: str
    backend: str  # the registry that provides it: CUDA, Vulkan, RPC, ...
    memory_free_mib: int
    memory_total_mib: int


@dataclass(frozen=True, slots=True)
class PrefillDevice:
    """A device checked to offload exactly the ubatches at least ``min_tokens`` wide."""

    name: str
    description: str
    min_tokens: int
    handle: int  # ggml_backend_dev_t, valid for the process's life


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _sig(lib: ctypes.CDLL, name: str, res: object, *args: object) -> Callable[..., Any]:
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = res, list(args)
    return fn


class _Ggml:
    """The few ggml-backend and ggml functions this module calls, bound on the already-mapped copy.

    Opened with RTLD_NOLOAD by soname: a path would map a second, independent ggml whose registry
    llama.cpp never sees (devices registered there silently do nothing).
    """

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libggml.so.0", mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        except OSError as exc:
            raise GgmlLibraryError(f"llama_cpp's libggml.so.0 is not loaded in this process ({exc})") from None
        p, s, z, b, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_bool, ctypes.c_int
        self.dev_count = _sig(lib, "ggml_backend_dev_count", z)
        self.dev_get = _sig(lib, "ggml_backend_dev_get", p, z)
        self.dev_name = _sig(lib, "ggml_backend_dev_name", s, p)
        self.dev_description = _sig(lib, "ggml_backend_dev_description", s, p)
        self.dev_type = _sig(lib, "ggml_backend_dev_type", i, p)
        self.dev_memory = _sig(lib, "ggml_backend_dev_memory", None, p, ctypes.POINTER(z), ctypes.POINTER(z))
        self.dev_backend_reg = _sig(lib, "ggml_backend_dev_backend_reg", p, p)
        self.reg_name = _sig(lib, "ggml_backend_reg_name", s, p)
        self.dev_offload_op = _sig(lib, "ggml_backend_dev_offload_op", b, p, p)
        self.init = _sig(lib, "ggml_init", p, _InitParams)
        self.free = _sig(lib, "ggml_free", None, p)
        self.new_tensor_2d = _sig(lib, "ggml_new_tensor_2d", p, p, i, ctypes.c_int64, ctypes.c_int64)
        self.mul_mat = _sig(lib, "ggml_mul_mat", p, p, p, p)


_lock = threading.Lock()
_ggml: _Ggml | None = None


def ggml() -> _Ggml:
    """The bound ggml functions; the first call in a process maps nothing new, it only looks up."""
    global _ggml
    with _lock:
        if _ggml is None:
            _ggml = _Ggml()
        return _ggml


def _info(g: _Ggml, dev: int) -> DeviceInfo:
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    g.dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return DeviceInfo(
        name=(g.dev_name(dev) or b"").decode(),
        kind=_TYPE_NAMES.get(g.dev_type(dev), "unknown"),
        description=(g.dev_description(dev) or b"").decode(),
        backend=(g.reg_name(g.dev_backend_reg(dev)) or b"").decode(),
        memory_free_mib=free.value >> 20,
        memory_total_mib=total.value >> 20,
    )


def _handles(g: _Ggml) -> list[int]:
    return [g.dev_get(i) for i in range(g.dev_count())]


def list_devices() -> list[DeviceInfo]:
    """Every device the installed llama.cpp registered (CPU included), in registry order."""
    g = ggml()
    return [_info(g, d) for d in _handles(g)]


def format_devices(devices: list[DeviceInfo]) -> str:
    rows = [f"{d.name:<12} {d.kind:<6} {d.backend:<10} {d.memory_total_mib:>8} MiB  {d.description}" for d in devices]
    usable = [d.name for d in devices if d.kind in ("gpu", "igpu")]
    tail = (
        ("--prefill-device takes one of: " + ", ".join(usable))
        if usable
        else "no device here can take prefill from the CPU (this llama-cpp-python was built for the CPU only)"
    )
    return "\n".join(["name         type   backend        memory  description", *rows, tail])


class _MatmulProbe:
    """A no-alloc ggml context holding matmul ops of chosen widths, to ask a device about them."""

    def __init__(self, g: _Ggml) -> None:
        self.g = g
        self.ctx = g.init(_InitParams(mem_size=1 << 20, mem_buffer=None, no_alloc=True))
        if not self.ctx:
            raise GgmlLibraryError("ggml_init failed for a 1 MiB metadata context")
        self.weight = g.new_tensor_2d(self.ctx, _GGML_TYPE_F32, 64, 64)

    def offloads(self, dev: int, n_tokens: int) -> bool:
        x = self.g.new_tensor_2d(self.ctx, _GGML_TYPE_F32, 64, n_tokens)
        op = self.g.mul_mat(self.ctx, self.weight, x)  # ne = [64, n_tokens]: a layer's matmul on a ubatch
        return bool(self.g.dev_offload_op(dev, op))

    def close(self) -> None:
        self.g.free(self.ctx)


def offload_threshold(dev: int) -> int | None:
    """The narrowest ubatch ``dev`` takes a host-weight matmul for, or None if it takes none.

    Binary search over widths, then the two neighbours re-asked: a rule that is not "from n on"
    (non-monotonic) is reported as None rather than as a threshold it does not have.
    """
    g = ggml()
    probe = _MatmulProbe(g)
    try:
        if not probe.offloads(dev, PROBE_MAX_TOKENS):
            return None
        lo, hi = 1, PROBE_MAX_TOKENS  # invariant: offloads(hi); lo-1 does not (or lo == 1)
        while lo < hi:
            mid = (lo + hi) // 2
            if probe.offloads(dev, mid):
                hi = mid
            else:
                lo = mid + 1
        monotonic = all(probe.offloads(dev, n) for n in (hi, hi + 1, 2 * hi)) and (
            hi == 1 or not probe.offloads(dev, hi - 1)
        )
        return hi if monotonic else None
    finally:
        probe.close()


_threshold_env_set = False


def set_threshold_env(min_tokens: int) -> None:
    """Ask backends that read ``GGML_OP_OFFLOAD_MIN_BATCH`` at registration for ``min_tokens``.

    It only works before the first look at the device registry in this process (the first model
    load, or a device listing); ``open_prefill_device`` checks what the device actually does.
    """
    global _threshold_env_set
    if not _threshold_env_set:
        os.environ[THRESHOLD_ENV] = str(min_tokens)
        _threshold_env_set = True


def open_prefill_device(name: str, min_tokens: int) -> PrefillDevice:
    """The device called ``name``, checked to offload exactly the ubatches >= ``min_tokens`` wide."""
    set_threshold_env(min_tokens)
    g = ggml()
    found = {_info(g, d).name: d for d in _handles(g)}
    dev = found.get(name)
    if dev is None:
        have = ", ".join(found) or "none"
        raise PrefillDeviceError(
            f"prefill_device: no device named {name!r} in this llama-cpp-python (it has: {have}); "
            "see bmoe-cli --list-devices, and install a llama-cpp-python built for that backend"
        )
    info = _info(g, dev)
    if info.kind == "cpu":
        raise PrefillDeviceError(
            f"prefill_device: {name} is the host CPU, which already runs every op; give an accelerator"
        )
    threshold = offload_threshold(dev)
    if threshold is None:
        raise PrefillDeviceError(
            f"prefill_device: {name} ({info.backend}) never takes ops whose weights stay on the host "
            "(its backend has no offload rule), so it cannot prefill for a host-resident model"
        )
    if threshold != min_tokens:
        raise PrefillDeviceError(
            f"prefill_min_tokens: {name} offloads ubatches from {threshold} tokens on, not {min_tokens}: the "
            f"backend fixed its threshold when it was first used in this process; start a new process, or "
            f"give --prefill-min-tokens {threshold}"
        )
    return PrefillDevice(name=info.name, description=info.description, min_tokens=min_tokens, handle=dev)


def device_list(device: PrefillDevice | None) -> ctypes.Array:
    """``llama_model_params.devices``: NULL-terminated. Empty (not NULL) without a device, since
    NULL would mean every registered device and put a GPU under a session that asked for none."""
    arr = (ctypes.c_void_p * 2)()
    arr[0] = device.handle if device is not None else None
    return arr


def ubatch_widths(n_tokens: int, n_batch: int, n_ubatch: int) -> list[int]:
    """How llama.cpp cuts one sequence's ``n_tokens`` fed in ``n_batch`` chunks: ubatches of
    ``n_ubatch`` tokens, the last one of each chunk narrower."""
    out: list[int] = []
    for start in range(0, n_tokens, n_batch):
        chunk = min(n_batch, n_tokens - start)
        out.extend(min(n_ubatch, chunk - u) for u in range(0, chunk, n_ubatch))
    return out
