"""Re-quantize a GGUF with llama.cpp's own quantizer (the only source of K-quants: the ``gguf``
package cannot write them)."""

from __future__ import annotations

import os
from pathlib import Path

import llama_cpp

from bmoe.errors import BmoeError
from bmoe.llama.lib import ensure_backend


class QuantizeError(BmoeError, RuntimeError):
    """llama.cpp refused or failed to quantize; the message names the files and the type."""


def quantize_gguf(
    src: Path, dst: Path, ftype: str = "Q4_K_M", n_threads: int = 0, allow_requantize: bool = False
) -> None:
    """Write ``dst`` as ``src`` quantized to ``ftype`` (a ``LLAMA_FTYPE_MOSTLY_*`` suffix such as
    ``"Q4_K_M"``), with llama.cpp's default per-tensor type choices. ``n_threads`` 0 = all cores.
    ``allow_requantize``: tensors ``src`` already holds quantized are dequantized and quantized
    again (llama.cpp refuses otherwise), e.g. a converter's MXFP4 experts to Q8_0."""
    code = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}", None)
    if code is None:
        raise QuantizeError(f"unknown llama.cpp file type {ftype!r} (expected e.g. 'Q4_K_M')")
    ensure_backend()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = code
    params.nthread = n_threads or (os.cpu_count() or 1)
    params.allow_requantize = allow_requantize
    rc = llama_cpp.llama_model_quantize(os.fsencode(src), os.fsencode(dst), params)
    if rc != 0:
        raise QuantizeError(f"llama_model_quantize({src} -> {dst}, {ftype}) failed with code {rc}")
