"""LlamaModel: a loaded GGUF, its vocabulary and metadata (adapter over llama.cpp)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import llama_cpp

from bmoe.errors import ModelFileError
from bmoe.llama.dense_anon import AnonDense, FileId, Segment, drop_unused, file_ids, file_segments
from bmoe.llama.devices import PrefillDevice, device_list
from bmoe.llama.lib import ensure_backend
from bmoe.llama.markup import Control, PlainReader, Span
from bmoe.llama.special_cuts import PIECE_BYTES, Cutter, Special

# The tokens llama.cpp reads from a text only when it parses special tokens.
_PARSED_ONLY = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN


@llama_cpp.llama_progress_callback
def _SILENT_PROGRESS(progress: float, user_data: ctypes.c_void_p) -> bool:
    return True


class ModelLoadError(ModelFileError):
    """The GGUF could not be opened by llama.cpp, or not set up once it was (the model is freed)."""


@dataclass(frozen=True, slots=True)
class ModelLoadParams:
    path: Path
    # mmap is what streaming rebinds over, and the resident reference uses the same load
    # so both run the same kernels on the same buffers.
    mmap: bool = True
    # Repacked ("extra") buffers would move expert rows away from their file offsets.
    use_extra_bufts: bool = False
    # The one device llama.cpp may offload wide ops to; the layers stay on the host either way.
    prefill_device: PrefillDevice | None = None
    # The file the user named, for messages, when ``path`` is a stand-in for it (a dense twin).
    user_path: Path | None = None
    # Byte ranges of the files llama.cpp maps (each file with its ranges) to move into anonymous
    # memory once loaded (--dense-weights anon: dense_anon.py); empty: all stays file-mapped.
    anon_ranges: tuple[tuple[Path, tuple[tuple[int, int], ...]], ...] = ()
    # Byte ranges of those files nobody reads (a streamed model's experts): the pages llama.cpp's
    # MAP_POPULATE put there are given back once loaded (dense_anon.drop_unused).
    unused_ranges: tuple[tuple[Path, tuple[tuple[int, int], ...]], ...] = ()
    # Integer metadata llama.cpp reads in place of the file's, as its --override-kv KEY=int:V does
    # (``<arch>.expert_used_count`` for --n-expert-used); ``meta()`` still returns the file's value.
    int_overrides: tuple[tuple[str, int], ...] = ()


def kv_overrides(pairs: tuple[tuple[str, int], ...]) -> ctypes.Array | None:
    """llama_model_params.kv_overrides for integer ``pairs``: an array of llama_model_kv_override
    ended by an entry whose key is empty, or None for no pairs. llama.cpp reads it while it loads
    (and the model keeps a copy of the params holding the pointer), so whoever sets it keeps the
    array alive as long as the model."""
    if not pairs:
        return None
    arr = (llama_cpp.llama_model_kv_override * (len(pairs) + 1))()
    room = llama_cpp.llama_model_kv_override.key.size  # type: ignore[attr-defined]  # a ctypes field: NUL-ended char[128]
    for entry, (key, value) in zip(arr, pairs):
        raw = key.encode()
        if not 0 < len(raw) < room:
            raise ValueError(f"kv override key {key!r} is empty or longer than {room - 1} bytes")
        entry.tag = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT
        entry.key = raw
        entry.value.val_i64 = int(value)
    return arr  # the last entry stays zeroed: its empty key ends the array


def refuse_early(path: Path, named: Path) -> None:
    """The failures llama.cpp would only log: a missing, empty or non-GGUF file, refused by name.

    ``named`` is what the message names: the user's file even when ``path`` is its dense twin."""
    if path.is_dir():
        raise ModelLoadError(f"model: {named} is a folder, not a .gguf file")
    if not path.is_file():  # also what is no regular file (a FIFO would block the read below)
        if path != named and Path(named).is_file():  # the twin went between its writing and this load
            raise ModelLoadError(
                f"model: the dense twin of {named} was removed while the session opened "
                "(--gc-twins in another process?); open it again"
            )
        raise ModelLoadError(f"model: file not found: {named}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(f"model: cannot read {named}: {e.strerror or e}") from None
    if not magic:
        raise ModelLoadError(f"model: {named} is empty (0 bytes), not a GGUF model")
    if magic != b"GGUF":
        raise ModelLoadError(f"model: {named} is not a GGUF file (it does not start with the bytes 'GGUF')")


class LlamaModel:
    def __init__(self, params: ModelLoadParams) -> None:
        ensure_backend()
        path = Path(params.path)
        refuse_early(path, params.user_path or path)
        mp = llama_cpp.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP if params.mmap else llama_cpp.LLAMA_LOAD_MODE_NONE
        # lazy_mode marks no expert tensor of the MoE archs at this version: no help to streaming
        mp.lazy_mode = llama_cpp.LLAMA_LAZY_MODE_OFF
        mp.use_extra_bufts = params.use_extra_bufts
        mp.progress_callback = _SILENT_PROGRESS  # llama.cpp's default prints dots to stderr
        # Only the asked-for device (or none): NULL here would hand llama.cpp every GPU it finds.
        self._devices = device_list(params.prefill_device)  # kept alive for the model's life
        mp.devices = ctypes.addressof(self._devices)
        mp.no_host = True  # weights in plain host buffers (mmap), never the device's pinned copies
        self._kv_overrides = kv_overrides(params.int_overrides)  # kept alive for the model's life
        if self._kv_overrides is not None:
            mp.kv_overrides = ctypes.cast(self._kv_overrides, ctypes.POINTER(llama_cpp.llama_model_kv_override))
        mapped = {p for p, _ in params.anon_ranges + params.unused_ranges}
        # Before the load: what the files are (a twin removed while it loads is still found) and
        # which mappings exist (those llama.cpp makes are the new ones).
        ids = file_ids(mapped)
        before = file_segments() if mapped else frozenset()
        named = params.user_path or path
        ptr = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        if not ptr:
            raise ModelLoadError(
                f"model: llama.cpp could not load {named} "
                "(not a GGUF it can read, or truncated; set BMOE_LLAMA_LOG=1 for its log)"
            )
        self.params = params
        self.path = path
        self.ptr = ptr
        try:  # from here on a failure frees the model: its weights (anonymous ones too) are GBs
            self._set_up(params, before, ids)
        except OSError as e:
            self.close()
            raise ModelLoadError(
                f"model: setting up {named} failed after llama.cpp loaded it ({e.strerror or type(e).__name__})"
            ) from e
        except BaseException:
            self.close()
            raise

    def _set_up(self, params: ModelLoadParams, before: frozenset[Segment], ids: dict[Path, FileId]) -> None:
        """What follows the load: the dense pages moved, the unused ones given back, the metadata."""
        ptr = self.ptr
        # The dense weights held in anonymous memory (None: they stay mapped from the file).
        self.anon: AnonDense | None = AnonDense.move(before, params.anon_ranges, ids) if params.anon_ranges else None
        self.dropped_bytes = drop_unused(before, params.unused_ranges, ids) if params.unused_ranges else 0
        self.vocab = llama_cpp.llama_model_get_vocab(ptr)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(ptr))
        self.n_layer = int(llama_cpp.llama_model_n_layer(ptr))
        self.arch = self.meta("general.architecture") or "unknown"
        self.is_recurrent = bool(llama_cpp.llama_model_is_recurrent(ptr))
        self.is_hybrid = bool(llama_cpp.llama_model_is_hybrid(ptr))
        used = self.meta(f"{self.arch}.expert_used_count")
        # The file's number of experts routed per token, and the one llama.cpp routes: the
        # override where one was given (meta() reads the file's metadata, never an override).
        self.n_expert_used_gguf = int(used) if used else 0
        self.n_expert_used = dict(params.int_overrides).get(f"{self.arch}.expert_used_count", self.n_expert_used_gguf)
        count = self.meta(f"{self.arch}.expert_count")
        self.n_expert = int(count) if count else 0
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.bos = int(llama_cpp.llama_vocab_bos(self.vocab))
        self.eos = int(llama_cpp.llama_vocab_eos(self.vocab))
        self._cutters: dict[bool, Cutter] = {}  # by parse_special, built on the first long text
        self._specials: list[tuple[int, bytes, int]] | None = None  # read on first need
        self._reader: PlainReader | None = None
        self._control_ids: dict[bytes, int] = {}

    # --- metadata -------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):  # value longer than the buffer: ask again with the exact size
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def file_size_bytes(self) -> int:
        return int(llama_cpp.llama_model_size(self.ptr))

    # --- vocabulary -------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """llama.cpp's tokens of ``text``, in time linear in its length whatever it holds.

        llama.cpp's split at the special tokens written in a text is quadratic in their number
        (special_cuts.py); a long text is tokenized in pieces of a few KB cut where that gives
        the same tokens, and what ``add_special`` adds (BOS, EOS) goes around the whole."""
        return self._tokenize_long(text.encode("utf-8"), add_special, parse_special)

    def tokenize_parts(self, parts: Sequence[tuple[str, bool]]) -> list[int]:
        """The tokens of the parts' texts end to end, each part ``(text, plain)``: special tokens
        are parsed in the markup (``plain`` false) only, and a plain part (a message's text) is
        read as plain text, a control token's text in it as the characters it is made of
        (markup.py). Where no control token's text touches a plain part these are llama.cpp's
        tokens of the whole text with special tokens parsed, computed so. Nothing is added
        around the text (no BOS); linear in the text, as ``tokenize``."""
        chunks = [text.encode("utf-8") for text, _ in parts]
        data = b"".join(chunks)
        plain: list[Span] = []
        at = 0
        for chunk, (_, is_plain) in zip(chunks, parts):
            if is_plain and chunk:
                plain.append((at, at + len(chunk)))
            at += len(chunk)
        reader = self._plain_reader()
        if not plain or not reader.overlaps(data, plain):
            return self._tokenize_long(data, False, True)
        toks: list[int] = []
        for frag in reader.partition(data, plain):
            if isinstance(frag, bytes):
                toks.append(self._control_id(frag))
            else:
                toks.extend(self._tokenize_long(data[frag[0] : frag[1]], False, False))
        return toks

    def holds_control_text(self, text: str) -> bool:
        """True when ``text`` holds the text of a token llama.cpp reads only when it parses
        special tokens (a control or unknown token): what a message must not turn into."""
        data = text.encode("utf-8")
        return self._plain_reader().overlaps(data, [(0, len(data))])

    def _tokenize_long(self, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        cuts = self._cutter(parse_special).cuts(data) if len(data) > PIECE_BYTES else []
        if not cuts:
            return self._tokenize(data, add_special, parse_special)
        bounds = [0, *cuts, len(data)]
        pieces = [self._tokenize(data[i:j], False, parse_special) for i, j in zip(bounds, bounds[1:])]
        toks = [t for piece in pieces for t in piece]
        if not add_special:
            return toks
        # What add_special puts around the first piece goes around the whole text instead.
        first = pieces[0]
        with_special = self._tokenize(data[: cuts[0]], True, parse_special)
        n_before = 1 if self.add_bos else 0
        if with_special[n_before : n_before + len(first)] != first:  # not BOS + text + EOS: no cutting
            return self._tokenize(data, add_special, parse_special)
        return with_special[:n_before] + toks + with_special[n_before + len(first) :]

    def _tokenize(self, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        cap = len(data) + 8
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def _special_tokens(self) -> list[tuple[int, bytes, int]]:
        """Every token llama.cpp's split at special tokens looks for (control, user-defined and
        unknown ones) as ``(id, text, attributes)``, read from the vocabulary once."""
        if self._specials is None:
            partitioned = (
                llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
                | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
                | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
            )
            specials = []
            for tok in range(self.n_vocab):
                attr = int(llama_cpp.llama_vocab_get_attr(self.vocab, tok))
                if attr & partitioned:
                    specials.append((tok, llama_cpp.llama_vocab_get_text(self.vocab, tok) or b"", attr))
            self._specials = specials
        return self._specials

    def _cutter(self, parse_special: bool) -> Cutter:
        """The special tokens llama.cpp's partition looks for under ``parse_special`` (the
        control and unknown ones only when it is set)."""
        cutter = self._cutters.get(parse_special)
        if cutter is None:
            skip = 0 if parse_special else _PARSED_ONLY
            cutter = self._cutters[parse_special] = Cutter(
                Special(text, bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP))
                for _, text, attr in self._special_tokens()
                if not attr & skip
            )
        return cutter

    def _plain_reader(self) -> PlainReader:
        """The tokens llama.cpp takes from text only when it parses special tokens (markup.py)."""
        if self._reader is None:
            self._reader = PlainReader(
                Control(
                    text, bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP), bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP)
                )
                for _, text, attr in self._special_tokens()
                if attr & _PARSED_ONLY
            )
        return self._reader

    def _control_id(self, text: bytes) -> int:
        """The token llama.cpp takes for a control token's text in parsed text."""
        tok = self._control_ids.get(text)
        if tok is None:
            alone = self._tokenize(text, False, True)
            if len(alone) == 1:
                tok = alone[0]
            else:  # not one token alone (a strip?): the first token of that text
                tok = next(t for t, s, attr in self._special_tokens() if s == text and attr & _PARSED_ONLY)
            self._control_ids[text] = tok
        return tok

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str:
        return b"".join(self.token_bytes(t, special=special) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_model_free(self.ptr)
            self.ptr = None
