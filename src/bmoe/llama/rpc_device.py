"""Test only: llama.cpp's RPC backend, served on 127.0.0.1 by this process's CPU, as a prefill device.

CI has no GPU. An RPC device is a second ggml backend whose buffers live behind a socket, which is
what matters for prefill offload: ggml's scheduler must copy weights to it per graph and read
results back, as it does for a GPU. Stock RPC has no ``offload_op``, so the scheduler never gives
it an op whose weights are on the host; ``install_offload_rule`` writes CUDA's rule (batch >=
threshold, batch measured as CUDA measures it) into the RPC device's own function table. That
write is guarded: refused unless the device is an RPC device, the table's layout checks out
against libggml's accessors, and the slot is empty (or already ours).

Never imported by the engine: only tests, gates and benches use it. It needs a llama-cpp-python
built with ``CMAKE_ARGS=-DGGML_RPC=ON`` (``llama_cpp.llama_supports_rpc()``).
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import llama_cpp

from bmoe.llama.devices import ggml
from bmoe.llama.ggml_tensor import GgmlTensor

# struct ggml_backend_device_i (ggml-backend-impl.h): 15 function pointers, then reg, context.
_N_IFACE = 15
_SLOT_GET_NAME, _SLOT_GET_DESCRIPTION, _SLOT_GET_TYPE, _SLOT_SUPPORTS_OP, _SLOT_OFFLOAD_OP = 0, 1, 3, 9, 11
_PTR = ctypes.sizeof(ctypes.c_void_p)
_OFFLOAD_OP_FN = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_void_p)
_NAME_FN = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)
_TYPE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class RpcUnavailable(RuntimeError):
    """This llama-cpp-python has no RPC backend (rebuild with CMAKE_ARGS=-DGGML_RPC=ON)."""


class HookRefused(RuntimeError):
    """The device's function table is not what the hook was written for; nothing was written."""


def rpc_supported() -> bool:
    return bool(llama_cpp.llama_supports_rpc())


def _rpc_lib() -> ctypes.CDLL:
    if not rpc_supported():
        raise RpcUnavailable("llama-cpp-python was built without RPC: reinstall it with CMAKE_ARGS=-DGGML_RPC=ON")
    ggml()  # binds the already-mapped libggml (by soname, never a second copy)
    for soname in ("libggml-rpc.so.0", "libggml.so.0"):  # RPC may be its own library or inside libggml
        try:
            lib = ctypes.CDLL(soname, mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)
            lib.ggml_backend_rpc_add_server  # noqa: B018 - raises AttributeError when absent
            return lib
        except (OSError, AttributeError):
            continue
    raise RpcUnavailable("llama_cpp reports RPC support but no loaded library exports ggml_backend_rpc_add_server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RpcServer:
    endpoint: str
    thread: threading.Thread


_server: RpcServer | None = None
_devices: dict[str, RpcPrefillDevice] = {}
_lock = threading.Lock()


def start_server(n_threads: int = 2, timeout_s: float = 30.0) -> RpcServer:
    """Serve this process's CPU device over RPC on 127.0.0.1 (once per process; a daemon thread
    that blocks in accept for the process's life)."""
    global _server
    with _lock:
        if _server is not None:
            return _server
        lib = _rpc_lib()
        g = ggml()
        fn = lib.ggml_backend_rpc_start_server
        fn.restype = None
        fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
        cpu = next((d for d in (g.dev_get(i) for i in range(g.dev_count())) if g.dev_type(d) == 0), None)
        if cpu is None:
            raise RpcUnavailable("no CPU device to serve")
        devs = (ctypes.c_void_p * 1)(cpu)
        port = _free_port()
        endpoint = f"127.0.0.1:{port}"
        t = threading.Thread(
            target=fn, args=(endpoint.encode(), None, n_threads, 1, devs), daemon=True, name=f"rpc-server-{port}"
        )
        t.start()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                break
            except OSError:
                if time.monotonic() > deadline or not t.is_alive():
                    raise RpcUnavailable(f"the RPC server on {endpoint} did not come up") from None
                time.sleep(0.05)
        _server = RpcServer(endpoint=endpoint, thread=t)
        _server.devs = devs  # type: ignore[attr-defined]  # the server keeps this pointer
        return _server


def register(endpoint: str) -> list[str]:
    """Register the server's devices with llama.cpp's registry; returns their names (RPC0, ...)."""
    lib = _rpc_lib()
    g = ggml()
    add = lib.ggml_backend_rpc_add_server
    add.restype, add.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    rn = ctypes.CDLL("libggml.so.0", mode=os.RTLD_NOLOAD)  # the registry lives in libggml
    reg_fn = rn.ggml_backend_register
    reg_fn.restype, reg_fn.argtypes = None, [ctypes.c_void_p]
    reg = add(endpoint.encode())
    if not reg:
        raise RpcUnavailable(f"no RPC server answered on {endpoint}")
    before = {g.dev_name(g.dev_get(i)).decode() for i in range(g.dev_count())}
    rn.ggml_backend_reg_dev_count.restype, rn.ggml_backend_reg_dev_count.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    rn.ggml_backend_reg_dev_get.restype, rn.ggml_backend_reg_dev_get.argtypes = (
        ctypes.c_void_p,
        [ctypes.c_void_p, ctypes.c_size_t],
    )
    names = [
        g.dev_name(rn.ggml_backend_reg_dev_get(reg, i)).decode() for i in range(rn.ggml_backend_reg_dev_count(reg))
    ]
    if not set(names) <= before:  # add_server returns the same reg for a known endpoint: register once
        reg_fn(reg)
    return names


@dataclass
class RpcPrefillDevice:
    """An RPC device with CUDA's offload rule installed; records what the rule was asked."""

    name: str
    handle: int
    min_batch: int
    asked: int = 0
    offloaded: int = 0
    widths_offloaded: set[int] = field(default_factory=set)
    widths_declined: set[int] = field(default_factory=set)
    _c_rule: Any = None

    def reset_counts(self) -> None:
        self.asked = self.offloaded = 0
        self.widths_offloaded.clear()
        self.widths_declined.clear()


def _op_ids() -> dict[str, int]:
    lib = ctypes.CDLL("libggml.so.0", mode=os.RTLD_NOLOAD)
    lib.ggml_op_name.restype, lib.ggml_op_name.argtypes = ctypes.c_char_p, [ctypes.c_int]
    want = {"GET_ROWS", "MUL_MAT", "MUL_MAT_ID", "ROPE", "ROPE_BACK"}
    out: dict[str, int] = {}
    for i in range(200):
        name = lib.ggml_op_name(i)
        if name is None:
            break
        if name.decode() in want:
            out[name.decode()] = i
    if set(out) != want:
        raise HookRefused(f"ggml op names not found: {sorted(want - set(out))}")
    return out


def _check_layout(handle: int, name: str) -> None:
    """The table must be a ggml_backend_device_i of an RPC device: slots read back as libggml says."""
    g = ggml()
    table = (ctypes.c_void_p * (_N_IFACE + 2)).from_address(handle)
    if table[_N_IFACE] != g.dev_backend_reg(handle):
        raise HookRefused(f"{name}: the reg pointer is not where ggml_backend_device puts it")
    if (g.reg_name(table[_N_IFACE]) or b"").decode() != "RPC":
        raise HookRefused(f"{name}: not an RPC device")
    for slot, fn_type, expected in (
        (_SLOT_GET_NAME, _NAME_FN, g.dev_name(handle)),
        (_SLOT_GET_DESCRIPTION, _NAME_FN, g.dev_description(handle)),
        (_SLOT_GET_TYPE, _TYPE_FN, g.dev_type(handle)),
    ):
        addr = table[slot]
        if not addr or fn_type(addr)(handle) != expected:
            raise HookRefused(f"{name}: function slot {slot} does not answer as libggml's accessor does")
    if not table[_SLOT_SUPPORTS_OP]:
        raise HookRefused(f"{name}: supports_op is empty")


def install_offload_rule(name: str, min_batch: int) -> RpcPrefillDevice:
    """Give RPC device ``name`` CUDA's offload rule with threshold ``min_batch`` (idempotent; a second
    call only changes the threshold)."""
    with _lock:
        if name in _devices:
            _devices[name].min_batch = min_batch
            return _devices[name]
        g = ggml()
        handle = next((d for d in (g.dev_get(i) for i in range(g.dev_count())) if g.dev_name(d).decode() == name), None)
        if handle is None:
            raise HookRefused(f"no device named {name}")
        _check_layout(handle, name)
        slot = ctypes.c_void_p.from_address(handle + _SLOT_OFFLOAD_OP * _PTR)
        if slot.value:
            raise HookRefused(f"{name}: offload_op is already set; refusing to overwrite a backend's own rule")
        ops = _op_ids()
        dev = RpcPrefillDevice(name=name, handle=handle, min_batch=min_batch)

        def batch_size(t: GgmlTensor) -> int:  # CUDA's get_op_batch_size
            if t.op == ops["GET_ROWS"]:
                return 0
            if t.op == ops["MUL_MAT"]:
                return int(t.ne[1])
            if t.op in (ops["MUL_MAT_ID"], ops["ROPE"], ops["ROPE_BACK"]):
                return int(t.ne[2])
            return int(t.ne[1] * t.ne[2] * t.ne[3])

        def rule(_dev: int, op: int) -> bool:
            n = batch_size(GgmlTensor.from_address(op))
            yes = n >= dev.min_batch
            dev.asked += 1
            dev.offloaded += yes
            (dev.widths_offloaded if yes else dev.widths_declined).add(n)
            return yes

        dev._c_rule = _OFFLOAD_OP_FN(rule)  # kept alive: the device holds the pointer for the process's life
        slot.value = ctypes.cast(dev._c_rule, ctypes.c_void_p).value
        _devices[name] = dev
        return dev


def remove_offload_rule(name: str) -> None:
    """Put the empty slot back (stock RPC again); only ever clears a rule this module wrote."""
    with _lock:
        dev = _devices.pop(name, None)
        if dev is None:
            return
        slot = ctypes.c_void_p.from_address(dev.handle + _SLOT_OFFLOAD_OP * _PTR)
        if slot.value != ctypes.cast(dev._c_rule, ctypes.c_void_p).value:
            raise HookRefused(f"{name}: offload_op is not the rule this module installed; leaving it")
        slot.value = None
        _retired.append(dev)  # a graph being scheduled elsewhere may still hold the old pointer


_retired: list[RpcPrefillDevice] = []


def rpc_prefill_device(min_batch: int) -> RpcPrefillDevice:
    """Start (once) the local server, register it, install the rule: a ready prefill device."""
    server = start_server()
    names = register(server.endpoint)
    return install_offload_rule(names[0], min_batch)
