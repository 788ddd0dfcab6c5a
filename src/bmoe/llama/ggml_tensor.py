"""A ctypes view of ``struct ggml_tensor``, and the startup check that it matches the library.

Streaming rebinds expert tensors' ``->data`` and reads the router's ids through this view. A
field at the wrong offset would corrupt memory silently, so before streaming starts the view
is compared with what libggml-base itself reports (name, type, shape, sizes, data, views);
any difference refuses streaming with a message naming the llama-cpp-python version.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp

from bmoe.errors import BmoeError

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64
GGML_TYPE_Q8_0 = 8
GGML_TYPE_I32 = 26
# sizeof(struct ggml_object) on 64-bit: offs, size, next, type + 4 bytes padding.
GGML_OBJECT_SIZE = 32
SUPPORTED_VERSION = "0.3.36"


class GgmlLayoutError(BmoeError, RuntimeError):
    """The ctypes ggml_tensor layout does not match the loaded ggml library: streaming refused."""


class GgmlTensor(ctypes.Structure):
    # Order and sizes from ggml/include/ggml.h of the llama.cpp vendored by llama-cpp-python 0.3.36.
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


NAME_OFFSET = GgmlTensor.name.offset
DATA_OFFSET = GgmlTensor.data.offset
SRC_OFFSET = GgmlTensor.src.offset


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _version() -> str:
    return str(getattr(llama_cpp, "__version__", "unknown"))


def refuse(detail: str) -> GgmlLayoutError:
    return GgmlLayoutError(
        f"bmoe's ctypes view of ggml_tensor does not match the ggml library of llama-cpp-python "
        f"{_version()} ({detail}); --moe-stream is refused. Streaming is checked against "
        f"llama-cpp-python=={SUPPORTED_VERSION}; install that version or run without --moe-stream."
    )


class GgmlBase:
    """The libggml-base instance llama_cpp uses, with the few functions bmoe calls."""

    def __init__(self) -> None:
        self.lib = self._loaded_instance()
        L = self.lib
        L.ggml_get_name.restype, L.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        L.ggml_nbytes.restype, L.ggml_nbytes.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
        L.ggml_get_data.restype, L.ggml_get_data.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
        L.ggml_tensor_overhead.restype, L.ggml_tensor_overhead.argtypes = ctypes.c_size_t, []
        L.ggml_op_name.restype, L.ggml_op_name.argtypes = ctypes.c_char_p, [ctypes.c_int]
        L.ggml_init.restype, L.ggml_init.argtypes = ctypes.c_void_p, [_InitParams]
        L.ggml_free.restype, L.ggml_free.argtypes = None, [ctypes.c_void_p]
        L.ggml_new_tensor_3d.restype = ctypes.c_void_p
        L.ggml_new_tensor_3d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
        L.ggml_view_2d.restype = ctypes.c_void_p
        L.ggml_view_2d.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_size_t,
            ctypes.c_size_t,
        ]
        L.ggml_set_name.restype, L.ggml_set_name.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]

    @staticmethod
    def _loaded_instance() -> ctypes.CDLL:
        """The copy libllama already mapped (by its soname), never a second one.

        The wheel ships lib/libggml-base.so and lib/libggml-base.so.0 as two separate files:
        opening the former by path maps a second, independent instance. RTLD_NOLOAD returns
        only an already-loaded object, matched by soname.
        """
        lib_dir = Path(llama_cpp.__file__).parent / "lib"
        names = sorted({p.name for p in lib_dir.glob("libggml-base.so.*") if p.name.count(".") == 2})
        for soname in names + ["libggml-base.so.0", "libggml-base.so"]:
            try:
                return ctypes.CDLL(soname, mode=os.RTLD_NOLOAD)
            except OSError:
                continue
        raise refuse(f"no libggml-base is loaded by llama_cpp (looked for {names or 'libggml-base.so.0'})")

    def name(self, t: int) -> bytes:
        return self.lib.ggml_get_name(t) or b""

    def nbytes(self, t: int) -> int:
        return int(self.lib.ggml_nbytes(t))


def view(t: int) -> GgmlTensor:
    return GgmlTensor.from_address(t)


def struct_nbytes(t: GgmlTensor) -> int:
    """ggml_nbytes recomputed from the view's ne/nb (the formula of ggml.c for blocked types)."""
    if any(n <= 0 for n in t.ne):
        return 0
    # nb[0] is the block size in bytes; ne[0]*nb[0]/blck is the row. Using the row stride of a
    # contiguous tensor: total = nb[3] * ne[3] holds for every contiguous (non-view) tensor.
    return int(t.nb[3] * t.ne[3])


def check_tensor(g: GgmlBase, t: int) -> None:
    """Compare one live tensor through the view against libggml; raise GgmlLayoutError."""
    s = view(t)
    if s.name != g.name(t):
        raise refuse(f"name {s.name!r} through the view, {g.name(t)!r} from ggml_get_name")
    if struct_nbytes(s) != g.nbytes(t):
        raise refuse(f"tensor {s.name!r}: {struct_nbytes(s)} bytes through the view, {g.nbytes(t)} from ggml_nbytes")
    if s.data != g.lib.ggml_get_data(t):
        raise refuse(f"tensor {s.name!r}: data pointer differs from ggml_get_data")


def self_check(g: GgmlBase | None = None) -> GgmlBase:
    """Build a tensor and a view in a private ggml context and compare every field bmoe uses."""
    g = g or GgmlBase()
    L = g.lib
    overhead = int(L.ggml_tensor_overhead())
    if overhead - GGML_OBJECT_SIZE != ctypes.sizeof(GgmlTensor):
        raise refuse(f"sizeof(ggml_tensor) is {overhead - GGML_OBJECT_SIZE}, the view has {ctypes.sizeof(GgmlTensor)}")
    ctx = L.ggml_init(_InitParams(1 << 20, None, False))
    if not ctx:
        raise refuse("ggml_init failed")
    try:
        t = L.ggml_new_tensor_3d(ctx, GGML_TYPE_Q8_0, 64, 3, 5)
        L.ggml_set_name(t, b"bmoe.selfcheck.blk.7.ffn_up_exps")
        s = view(t)
        if s.type != GGML_TYPE_Q8_0 or tuple(s.ne) != (64, 3, 5, 1):
            raise refuse(f"type/ne read as {s.type}/{tuple(s.ne)}, expected {GGML_TYPE_Q8_0}/(64, 3, 5, 1)")
        check_tensor(g, t)
        if g.nbytes(t) != 64 // 32 * 34 * 3 * 5:
            raise refuse(f"Q8_0 [64,3,5] is {g.nbytes(t)} bytes, expected {64 // 32 * 34 * 15}")
        ids = L.ggml_new_tensor_3d(ctx, GGML_TYPE_I32, 8, 4, 1)
        v = L.ggml_view_2d(ctx, ids, 2, 4, view(ids).nb[1], 4)
        L.ggml_set_name(v, b"ffn_moe_topk-7")
        sv = view(v)
        if sv.view_src != ids or sv.view_offs != 4 or sv.src[0] != ids:
            raise refuse("view_src/view_offs/src[0] of a view read wrong")
        if sv.nb[1] != 32 or sv.data != view(ids).data + 4 or sv.name != b"ffn_moe_topk-7":
            raise refuse(f"view strides/data/name read wrong (nb[1]={sv.nb[1]}, name={sv.name!r})")
        if L.ggml_op_name(sv.op) != b"VIEW":
            raise refuse(f"op of a view reads as {L.ggml_op_name(sv.op)!r}")
    finally:
        L.ggml_free(ctx)
    return g
