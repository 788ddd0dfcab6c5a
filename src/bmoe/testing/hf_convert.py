"""Build a tiny HF model from a recipe and convert it with llama.cpp's own converter.

``write_hf_arch("olmoe", "q8_0", out_dir)`` returns a cached GGUF. The HF folder it was made from
(``hf_dir(...)``) stays beside it for the transformers reference. Everything is deterministic
(seeded init, fixed tokenizer), and a file is reused while its recipe hash (recipe, torch,
transformers, converter) is unchanged.

The converter is the one vendored in the pinned llama-cpp-python's source release; scripts/setup.sh
--test unpacks it into ``.venv/share/llama.cpp`` (or set ``BMOE_LLAMA_CONVERTER`` to a
``convert_hf_to_gguf.py``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from bmoe.testing.hf_archs import HfArch, hf_arch
from bmoe.testing.writer import _is_current, _sidecar

# What the converter writes itself; anything else is quantized by llama.cpp from the F32 file.
_CONVERTER_TYPES = ("f32", "q8_0")
_QUANTIZER_TYPES = {"q4_k_m": "Q4_K_M", "mxfp4_moe": "MXFP4_MOE"}
RECIPE_VERSION = 1


class ConverterMissing(RuntimeError):
    """llama.cpp's convert_hf_to_gguf.py is not where setup puts it."""


def converter_path() -> Path:
    env = os.environ.get("BMOE_LLAMA_CONVERTER")
    path = Path(env) if env else Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py"
    if not path.is_file():
        raise ConverterMissing(f"llama.cpp's converter is not at {path}: run `bash scripts/setup.sh --test` "
                               "(it unpacks it from llama-cpp-python's source release) or set BMOE_LLAMA_CONVERTER")
    return path


def hf_dir(arch: str, out_dir: Path) -> Path:
    return Path(out_dir) / f"hf-{arch}"


def _recipe(a: HfArch, quant: str) -> str:
    parts = {
        "recipe_version": RECIPE_VERSION,
        "arch": dataclasses.asdict(a),
        "quant": quant,
        "versions": [version(p) for p in ("torch", "transformers", "tokenizers", "llama_cpp_python")],
        "converter": hashlib.sha256(converter_path().read_bytes()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def write_hf_model(a: HfArch, out: Path) -> Path:
    """The tiny HF folder (config, safetensors, tokenizer) of recipe ``a``; always rewritten."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from bmoe.testing.hf_tokenizer import write_hf_tokenizer

    ids = write_hf_tokenizer(out)
    config = AutoConfig.for_model(a.model_type, bos_token_id=ids["bos"], eos_token_id=ids["eos"],
                                  pad_token_id=ids["pad"], **a.hf_config())
    torch.manual_seed(a.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    return out


def load_reference(arch: str, out_dir: Path):
    """transformers' model of the tiny ``arch`` (eager attention, F32, eval mode), with the
    recipe's reference-side config changes applied."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    a = hf_arch(arch)
    folder = hf_dir(arch, out_dir)
    config = AutoConfig.from_pretrained(folder)
    for key, value in a.reference_config.items():
        setattr(config, key, value)
    model = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32,
                                                 attn_implementation="eager")
    return model.eval()


def write_hf_arch(arch: str, quant: str, out_dir: Path) -> Path:
    """Path of the tiny ``arch`` GGUF in ``quant`` under ``out_dir``, made when missing or stale."""
    a = hf_arch(arch)
    quant = quant.lower()
    if quant not in (*_CONVERTER_TYPES, *_QUANTIZER_TYPES):
        raise ValueError(f"unknown quant {quant!r} for the tiny {arch}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"tiny-{arch}-{quant}.gguf"
    recipe = _recipe(a, quant)
    if _is_current(path, recipe) and (hf_dir(arch, out_dir) / "config.json").is_file():
        return path
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        if quant in _QUANTIZER_TYPES:
            from bmoe.llama.quantize import quantize_gguf

            quantize_gguf(write_hf_arch(arch, "f32", out_dir), tmp, _QUANTIZER_TYPES[quant])
        else:
            folder = hf_dir(arch, out_dir)
            if not ((folder / "config.json").is_file()
                    and _is_current(out_dir / f"tiny-{arch}-f32.gguf", _recipe(a, "f32"))):
                write_hf_model(a, folder)
            _convert(folder, tmp, quant)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _sidecar(path).write_text(json.dumps({"recipe": recipe, "size": path.stat().st_size}) + "\n")
    return path


def _convert(folder: Path, dst: Path, outtype: str) -> None:
    cmd = [sys.executable, str(converter_path()), str(folder), "--outtype", outtype, "--outfile", str(dst)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not dst.is_file():
        tail = "\n".join((r.stderr or r.stdout).splitlines()[-25:])
        raise RuntimeError(f"convert_hf_to_gguf.py failed for {folder} ({outtype}), rc {r.returncode}:\n{tail}")
