"""Projector: a model's vision projector (``--mmproj``), over llama.cpp's libmtmd.

It runs resident on the CPU beside the language model, whatever streams the language model's
experts: an image becomes a run of embeddings (``encode``) that the language model then prefills
like tokens (``prefill``), through the same context, so the streaming hook sees those graphs too.

An image in a prompt is what mtmd makes of its marker: the text tokens the projector wants before
and after it (Qwen-VL's ``<|vision_start|>`` and ``<|vision_end|>``) and the image's own tokens.
bmoe tokenizes the rest of the prompt itself, so only that expansion comes from mtmd
(``load``). An image's tokens take positions of their own (M-RoPE: one temporal position for the
whole image, the text after it ``n_pos`` later), which is why the KV bookkeeping asks each image
how many positions it spans.

Bad input is refused here, before anything is prefilled: bytes that are no image llama.cpp can
read (``ImageError``), a projector file llama.cpp refuses or one made for another language model
(``ProjectorError``).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
import numpy as np

from bmoe.errors import ModelFileError
from bmoe.image_refs import ImageError
from bmoe.llama.context import ContextError, LlamaContext
from bmoe.llama.image_size import MAX_PIXELS, image_size, refuse_oversize
from bmoe.llama.lib import ensure_backend
from bmoe.llama.model import LlamaModel

# Where mtmd's helper would look for ffmpeg when the bytes are no image or audio (it then tries
# them as a video): nowhere, so that bytes that are no image are refused, never run through ffmpeg.
_NO_FFMPEG = b"/nonexistent/bmoe-no-ffmpeg"

# The formats stb_image (mtmd's image decoder) reads, by their first bytes.
_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
)
IMAGE_FORMATS = "PNG, JPEG, GIF or BMP"


class ProjectorError(ModelFileError):
    """The --mmproj file cannot be used with this model."""


def image_format(data: bytes) -> str | None:
    """The image format ``data`` starts like (``"PNG"``, ...), or None."""
    for magic, name in _IMAGE_MAGIC:
        if data.startswith(magic):
            return name
    return None


class _Log:
    """mtmd's log lines: kept (the last error explains a refusal), printed only with
    BMOE_LLAMA_LOG=1, as llama.cpp's own (bmoe.llama.lib)."""

    def __init__(self) -> None:
        self.verbose = os.environ.get("BMOE_LLAMA_LOG", "") not in ("", "0")
        self.errors: list[str] = []
        self._lock = threading.Lock()

        @llama_cpp.llama_log_callback
        def _cb(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
            line = text.decode("utf-8", errors="replace")
            if level >= 4:  # GGML_LOG_LEVEL_ERROR
                with self._lock:
                    self.errors = (self.errors + [line.strip()])[-8:]
            if self.verbose:
                sys.stderr.write(line)

        self.c_callback = _cb

    def take(self) -> str:
        with self._lock:
            lines, self.errors = [" ".join(e.split()) for e in self.errors if e.strip()], []
        return "; ".join(lines)  # one line: a refusal's message is one line


_LOG: _Log | None = None


def _log() -> _Log:
    global _LOG
    if _LOG is None:
        _LOG = _Log()
        mtmd.mtmd_helper_log_set(_LOG.c_callback, None)  # mtmd's own log too
    return _LOG


@dataclass(eq=False)
class Image:
    """One image, read and tokenized by the projector, not yet encoded.

    ``key`` is the SHA-256 of its file's bytes (mtmd's id): the same file is the same image.
    ``before`` and ``after`` are the text tokens the projector puts around it; ``n_tokens`` the
    image's own (its KV cells), ``n_pos`` the positions they span."""

    key: str
    width: int
    height: int
    before: tuple[int, ...]
    after: tuple[int, ...]
    n_tokens: int
    n_pos: int
    _chunk: int = field(repr=False, default=0)  # an owned mtmd_input_chunk


class Projector:
    def __init__(self, path: Path, model: LlamaModel, *, n_threads: int, flash_attn: bool | None) -> None:
        ensure_backend()
        log = _log()
        path = Path(path)
        _refuse_file(path)
        caps = mtmd.mtmd_get_cap_from_file(str(path).encode())
        log.take()
        if not caps.inp_vision:
            raise ProjectorError(
                f"mmproj: {path} has no vision encoder (it is no image projector llama.cpp "
                "can read, or an audio-only one): give the model's vision projector GGUF"
            )
        p = mtmd.mtmd_context_params_default()
        p.use_gpu = False
        p.print_timings = False
        p.warmup = False
        p.n_threads = n_threads
        p.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
            if flash_attn is None
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if flash_attn
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        ptr = mtmd.mtmd_init_from_file(str(path).encode(), model.ptr, p)
        if not ptr:
            why = log.take()
            if "mismatch" in why:
                raise ProjectorError(
                    f"mmproj: {path} does not match the model {model.params.user_path or model.path} "
                    f"(llama.cpp: {why}): give the projector made for this model"
                )
            raise ProjectorError(
                f"mmproj: llama.cpp could not load {path} as a projector" + (f" ({why})" if why else "")
            )
        self.ptr = ptr
        self.path = path
        self.model = model
        self.marker = (mtmd.mtmd_default_marker() or b"<__media__>").decode()
        self.n_embd = int(llama_cpp.llama_model_n_embd_inp(model.ptr))
        self.mrope = bool(mtmd.mtmd_decode_use_mrope(ptr))
        self._lock = threading.Lock()  # encode is not thread-safe
        self._density: float | None = None  # pixels per image token, measured (pixel_cap)
        self._caps: dict[int, int] = {}  # n_ctx -> pixel_cap
        self._cap_holds: dict[int, bool] = {}  # n_ctx -> a blank image of pixel_cap is over n_ctx tokens

    # --- reading an image -------------------------------------------------------------
    def load(self, data: bytes, name: str, n_ctx: int | None = None) -> Image:
        """Read ``data`` (a file's bytes; ``name`` says where it came from in messages) into an
        ``Image``: decoded, resized as the projector wants, tokenized. ImageError if it is no
        image llama.cpp reads, or (from its header, before decoding) more pixels than bmoe
        decodes or than a context of ``n_ctx`` tokens could hold."""
        if not data:
            raise ImageError(f"{name} is empty (0 bytes), not an image")
        fmt = image_format(data)
        if fmt is None:
            raise ImageError(f"{name} is not an image ({IMAGE_FORMATS} are read)")
        w, h = image_size(data, fmt, name)
        refuse_oversize(name, fmt, w, h)
        if n_ctx is not None and self._over_cap(w * h, n_ctx):
            raise ImageError(
                f"{name} is a {w}x{h} {fmt} ({w * h} pixels): this projector makes about one image token "
                f"per {self._density:.0f} pixels, so it is far more image tokens than the context holds "
                f"(n_ctx {n_ctx}); scale it down",
                "image_too_large",
            )
        return self._decode(data, name)

    def pixel_cap(self, n_ctx: int) -> int:
        """The pixels over which an image is taken to be too big for a context of ``n_ctx`` tokens:
        twice the pixels the projector turns into ``n_ctx`` tokens (its pixels per token measured
        once, on a blank 256 x 256 bitmap; the margin covers its rounding of odd sizes), at most
        MAX_PIXELS."""
        cap = self._caps.get(n_ctx)
        if cap is None:
            if self._density is None:
                self._density = 256 * 256 / max(1, self._probe(256))
            side = int((2 * n_ctx * self._density) ** 0.5) + 1
            cap = side * side if side * side < MAX_PIXELS else MAX_PIXELS
            self._caps[n_ctx] = cap
        return cap

    def _over_cap(self, pixels: int, n_ctx: int) -> bool:
        """Whether an image of ``pixels`` cannot fit: over ``pixel_cap``, and a blank square of the
        cap's size is indeed more than ``n_ctx`` tokens (a projector that scales big images down
        may fit any of them). The square is measured once, when an image that big first comes."""
        cap = self.pixel_cap(n_ctx)
        if pixels <= cap or cap == MAX_PIXELS:
            return False
        if n_ctx not in self._cap_holds:
            self._cap_holds[n_ctx] = self._probe(int(cap**0.5)) > n_ctx
        return self._cap_holds[n_ctx]

    def _probe(self, side: int) -> int:
        """The image tokens the projector makes of a blank ``side`` x ``side`` image."""
        pixels = (ctypes.c_uint8 * (side * side * 3))()
        bitmap = mtmd.mtmd_bitmap_init(side, side, pixels)
        if not bitmap:
            raise ImageError(f"llama.cpp could not make a {side}x{side} bitmap to measure the projector")
        return self._tokenize(bitmap, f"a blank {side}x{side} image").n_tokens

    def _decode(self, data: bytes, name: str) -> Image:
        log = _log()
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        opt = mtmd.mtmd_helper_init_opt_default()
        opt.video_params.ffmpeg_bin_dir = _NO_FFMPEG
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.ptr, buf, len(data), False, opt)
        if not bitmap:
            log.take()
            raise ImageError(f"{name} is corrupt: its {image_format(data)} data cannot be decoded")
        return self._tokenize(bitmap, name)

    def _tokenize(self, bitmap: int, name: str) -> Image:
        """The Image of a decoded ``bitmap`` (freed here)."""
        log = _log()
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            text = mtmd.mtmd_input_text()
            marker = self.marker.encode()
            text.text = marker
            text.text_len = len(marker)
            text.add_special = False
            text.parse_special = True
            arr = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
            rc = mtmd.mtmd_tokenize(self.ptr, chunks, ctypes.byref(text), arr, 1)
            if rc != 0:
                raise ImageError(
                    f"{name}: llama.cpp could not preprocess the image (mtmd_tokenize {rc}"
                    + (f": {log.take()}" if log.errors else "")
                    + ")"
                )
            return self._image(chunks, mtmd.mtmd_bitmap_get_nx(bitmap), mtmd.mtmd_bitmap_get_ny(bitmap), name)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            mtmd.mtmd_bitmap_free(bitmap)

    def _image(self, chunks: int, width: int, height: int, name: str) -> Image:
        before: list[int] = []
        after: list[int] = []
        found: int | None = None
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            c = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(c)
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                toks = mtmd.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(n))
                (after if found is not None else before).extend(int(toks[j]) for j in range(n.value))
            elif kind == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE and found is None:
                found = c
            else:
                raise ImageError(
                    f"{name}: the projector made more than one image of it (a tiled or "
                    "video image), which bmoe does not prefill"
                )
        if found is None:
            raise ImageError(f"{name}: the projector made no image tokens of it")
        key = (mtmd.mtmd_input_chunk_get_id(found) or b"").decode()
        owned = mtmd.mtmd_input_chunk_copy(found)
        if not owned:
            raise ImageError(f"{name}: llama.cpp could not copy the image's tokens")
        image = Image(
            key=key,
            width=int(width),
            height=int(height),
            before=tuple(before),
            after=tuple(after),
            n_tokens=int(mtmd.mtmd_input_chunk_get_n_tokens(found)),
            n_pos=int(mtmd.mtmd_input_chunk_get_n_pos(found)),
            _chunk=owned,
        )
        weakref.finalize(image, mtmd.mtmd_input_chunk_free, owned)
        return image

    # --- computing it -------------------------------------------------------------------
    def encode(self, image: Image) -> np.ndarray:
        """The image's embeddings, the vision encoder run once ``# [n_tokens, n_embd] float32``."""
        with self._lock:
            rc = mtmd.mtmd_encode_chunk(self.ptr, image._chunk)
            if rc != 0:
                raise ContextError(f"the projector failed to encode an image (mtmd_encode_chunk {rc}: {_log().take()})")
            out = mtmd.mtmd_get_output_embd(self.ptr)
            if not out:
                raise ContextError("the projector encoded an image but returned no embeddings")
            return np.ctypeslib.as_array(out, shape=(image.n_tokens, self.n_embd)).copy()

    def prefill(self, ctx: LlamaContext, image: Image, embd: np.ndarray, pos0: int, seq: int = 0) -> None:
        """Prefill the image's embeddings ``embd`` into ``ctx`` at position ``pos0`` of ``seq``
        (its tokens' positions as the projector lays them out), ``n_batch`` at a time; no logits."""
        if embd.shape != (image.n_tokens, self.n_embd) or embd.dtype != np.float32 or not embd.flags.c_contiguous:
            raise ContextError(f"image embeddings of shape {embd.shape} for an image of {image.n_tokens} tokens")
        new_pos = llama_cpp.llama_pos(0)
        rc = mtmd.mtmd_helper_decode_image_chunk(
            self.ptr,
            ctx.ptr,
            image._chunk,
            embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            pos0,
            seq,
            ctx.n_batch,
            ctypes.byref(new_pos),
            mtmd.mtmd_helper_post_decode_callback(),
            None,
        )
        ctx.after_decode(rc, f"llama_decode of an image failed with code {rc} at position {pos0}")

    def close(self) -> None:
        if self.ptr:
            mtmd.mtmd_free(self.ptr)
            self.ptr = None


def _refuse_file(path: Path) -> None:
    """A missing, empty or non-GGUF --mmproj, refused by name before llama.cpp logs it away."""
    if path.is_dir():
        raise ProjectorError(f"mmproj: {path} is a folder, not a .gguf file")
    if not path.is_file():
        raise ProjectorError(f"mmproj: file not found: {path}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ProjectorError(f"mmproj: cannot read {path}: {e.strerror or e}") from None
    if magic != b"GGUF":
        raise ProjectorError(f"mmproj: {path} is not a GGUF file (it does not start with the bytes 'GGUF')")
