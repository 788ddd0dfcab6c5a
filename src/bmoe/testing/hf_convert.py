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

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

from bmoe.testing.recipe import Recipe, hashed_fields
from bmoe.testing.recipes import hf_arch
from bmoe.testing.writer import _is_current, _sidecar, generation_lock

# What the converter writes itself; anything else is quantized by llama.cpp from the F32 file.
_CONVERTER_TYPES = ("f32", "q8_0")
_QUANTIZER_TYPES = {"q4_k_m": "Q4_K_M", "q6_k": "Q6_K", "iq4_xs": "IQ4_XS", "mxfp4_moe": "MXFP4_MOE"}
RECIPE_VERSION = 1
# Fixups.checkpoint layouts: the module that makes each (prepare_model before saving,
# write_checkpoint before converting).
CHECKPOINTS = {"deepseek4": "bmoe.testing.hf_deepseek4"}


class ConverterMissing(RuntimeError):
    """llama.cpp's convert_hf_to_gguf.py is not where setup puts it."""


def converter_path() -> Path:
    env = os.environ.get("BMOE_LLAMA_CONVERTER")
    path = Path(env) if env else Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py"
    if not path.is_file():
        raise ConverterMissing(
            f"llama.cpp's converter is not at {path}: run `bash scripts/setup.sh --test` "
            "(it unpacks it from llama-cpp-python's source release) or set BMOE_LLAMA_CONVERTER"
        )
    return path


def hf_dir(arch: str, out_dir: Path) -> Path:
    return Path(out_dir) / f"hf-{arch}"


@functools.lru_cache(maxsize=1)
def _toolchain() -> dict[str, object]:
    """What every recipe hash covers besides the recipe: the versions that build and convert the
    model, and the converter's bytes (read once per process: a test asks for models many times)."""
    return {
        "versions": [version(p) for p in ("torch", "transformers", "tokenizers", "llama_cpp_python")],
        "converter": hashlib.sha256(converter_path().read_bytes()).hexdigest(),
    }


def _recipe(a: Recipe, quant: str) -> str:
    parts = {"recipe_version": RECIPE_VERSION, "arch": hashed_fields(a), "quant": quant, **_toolchain()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def write_hf_model(a: Recipe, out: Path) -> Path:
    """The tiny HF folder (config, safetensors, tokenizer) of recipe ``a``; always rewritten."""
    import torch
    import transformers
    from transformers import AutoConfig

    from bmoe.testing.hf_tokenizer import write_hf_tokenizer

    ids = write_hf_tokenizer(out, a.special_tokens, a.tokenizer)
    cfg = a.hf_config()
    n_layer = int(cfg.get("num_hidden_layers") or 0)
    if a.fix.mtp_layers:  # built as ordinary trailing layers, then made NextN blocks (hf_mtp.py)
        cfg["num_hidden_layers"] = n_layer + a.fix.mtp_layers
    config = AutoConfig.for_model(
        a.model_type, bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"], **cfg
    )
    torch.manual_seed(a.seed)
    model = getattr(transformers, a.auto_class).from_config(config, dtype=torch.float32)
    std = getattr(config, "initializer_range", None) or config.get_text_config().initializer_range
    _randomize(model, a.fix.random_init, float(a.fix.random_init_std or std))
    if a.fix.checkpoint:
        _checkpoint_module(a.fix.checkpoint).prepare_model(model, a.seed)
    model.save_pretrained(out)
    if a.preprocessor is not None:
        (out / "preprocessor_config.json").write_text(json.dumps(a.preprocessor, indent=2) + "\n")
    if a.fix.checkpoint_transpose:
        _transpose_saved(out, a.fix.checkpoint_transpose)
    if a.fix.checkpoint_rename:
        _rename_saved(out, a.fix.checkpoint_rename)
    if a.fix.checkpoint_drop:
        _drop_saved(out, a.fix.checkpoint_drop)
    if a.fix.checkpoint_index:
        _write_index(out)
    if a.fix.saved_config:
        saved = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**saved, **a.fix.saved_config}, indent=2))
    if a.fix.mtp_layers:
        from bmoe.testing.hf_mtp import add_mtp_block

        add_mtp_block(out, n_layer, a.fix.mtp_layers, a.seed)
    return out


def _checkpoint_module(layout: str):
    import importlib

    if layout not in CHECKPOINTS:
        raise ValueError(f"unknown checkpoint layout {layout!r}; known: {', '.join(sorted(CHECKPOINTS))}")
    return importlib.import_module(CHECKPOINTS[layout])


def _transpose_saved(out: Path, suffixes: tuple[str, ...]) -> None:
    """Swap the last two dims of the saved tensors named by ``suffixes`` (Fixups.checkpoint_transpose)."""
    from safetensors.torch import load_file, save_file

    (path,) = out.glob("*.safetensors")  # the tiny models are one shard
    tensors = load_file(path)
    hit = [n for n in tensors if n.endswith(suffixes)]
    missing = [s for s in suffixes if not any(n.endswith(s) for n in hit)]
    if missing:
        raise ValueError(f"checkpoint_transpose names no saved tensor: {missing}")
    for n in hit:
        tensors[n] = tensors[n].transpose(-1, -2).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})


def _rename_saved(out: Path, renames: tuple[tuple[str, str], ...]) -> None:
    """Rewrite the saved tensor names by ``renames`` (Fixups.checkpoint_rename), in turn."""
    import re

    from safetensors.torch import load_file, save_file

    (path,) = out.glob("*.safetensors")  # the tiny models are one shard
    tensors = load_file(path)
    for pattern, repl in renames:
        if not any(re.search(pattern, n) for n in tensors):
            raise ValueError(f"checkpoint_rename names no saved tensor: {pattern!r}")
        tensors = {re.sub(pattern, repl, n): t for n, t in tensors.items()}
    save_file(tensors, path, metadata={"format": "pt"})


def _drop_saved(out: Path, suffixes: tuple[str, ...]) -> None:
    """Remove the saved tensors named by ``suffixes`` (Fixups.checkpoint_drop)."""
    from safetensors.torch import load_file, save_file

    (path,) = out.glob("*.safetensors")  # the tiny models are one shard
    tensors = load_file(path)
    missing = [s for s in suffixes if not any(n.endswith(s) for n in tensors)]
    if missing:
        raise ValueError(f"checkpoint_drop names no saved tensor: {missing}")
    save_file({n: t for n, t in tensors.items() if not n.endswith(suffixes)}, path, metadata={"format": "pt"})


def _write_index(out: Path) -> None:
    """model.safetensors.index.json naming the one shard for every tensor (Fixups.checkpoint_index)."""
    from safetensors import safe_open

    (path,) = out.glob("*.safetensors")  # the tiny models are one shard
    with safe_open(path, "pt") as f:
        names = sorted(f.keys())
    index = {"metadata": {"total_size": path.stat().st_size}, "weight_map": {n: path.name for n in names}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _randomize(model, suffixes: tuple[str, ...], std: float) -> None:
    """Fill the recipe's ``random_init`` tensors (constants at init) with seeded normal values."""
    import torch

    if not suffixes:
        return
    named = [*model.named_parameters(), *model.named_buffers()]
    hit = [(n, t) for n, t in named if n.endswith(suffixes)]
    missing = [s for s in suffixes if not any(n.endswith(s) for n, _ in hit)]
    if missing:
        raise ValueError(f"random_init names no tensor of the model: {missing}")
    with torch.no_grad():
        for _, t in hit:
            t.normal_(0.0, std)


def load_reference(arch: str, out_dir: Path):
    """transformers' model of the tiny ``arch`` (eager attention, F32, eval mode), with the
    recipe's reference-side config changes applied."""
    import torch
    import transformers
    from transformers import AutoConfig

    from bmoe.testing import ggml_rounding

    ggml_rounding.register()  # activations a recipe's reference_config may name
    a = hf_arch(arch)
    folder = hf_dir(arch, out_dir)
    if "model_type" in a.fix.saved_config:
        # The folder names a model_type transformers does not know (Fixups.saved_config): the
        # config is the recipe's model_type with the saved keys.
        saved = json.loads((folder / "config.json").read_text())
        del saved["model_type"]
        config = AutoConfig.for_model(a.model_type, **saved)
    else:
        config = AutoConfig.from_pretrained(folder)
    for key, value in a.reference_config.items():
        setattr(config, key, value)
    model = getattr(transformers, a.auto_class).from_pretrained(
        folder, config=config, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


def write_hf_arch(arch: str, quant: str, out_dir: Path) -> Path:
    """Path of the tiny ``arch`` GGUF in ``quant`` under ``out_dir``, made when missing or stale.
    ``arch`` names the recipe (recipes.RECIPES): the file and HF folder are named after it."""
    a = hf_arch(arch)
    quant = quant.lower()
    if quant not in (*_CONVERTER_TYPES, *_QUANTIZER_TYPES):
        raise ValueError(f"unknown quant {quant!r} for the tiny {arch}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"tiny-{arch}-{quant}.gguf"
    with generation_lock(path):
        return _write_hf_arch_locked(arch, a, quant, out_dir, path)


def _write_hf_arch_locked(arch: str, a: Recipe, quant: str, out_dir: Path, path: Path) -> Path:
    recipe = _recipe(a, quant)
    folder = _current_hf_folder(arch, a, out_dir)
    if _is_current(path, recipe):
        return path
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        if quant in _QUANTIZER_TYPES or (quant == "q8_0" and a.fix.checkpoint):
            from bmoe.llama.quantize import quantize_gguf

            # A real-layout checkpoint's converter output keeps its packed experts (DeepSeek-V4's
            # MXFP4) whatever the outtype: its Q8_0 file is llama.cpp's quantizer's, from them.
            quantize_gguf(
                write_hf_arch(arch, "f32", out_dir),
                tmp,
                _QUANTIZER_TYPES.get(quant, "Q8_0"),
                allow_requantize=quant == "q8_0",
            )
        elif a.fix.checkpoint:
            # The converter reads the real layout, written into a private folder of the HF
            # folder's own name (the converter names the model after its folder).
            with tempfile.TemporaryDirectory(dir=out_dir) as scratch:
                src = _checkpoint_module(a.fix.checkpoint).write_checkpoint(folder, Path(scratch) / folder.name)
                _convert(src, tmp, quant, a.fix.converter_args)
        else:
            _convert(folder, tmp, quant, a.fix.converter_args)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _sidecar(path).write_text(json.dumps({"recipe": recipe, "size": path.stat().st_size}) + "\n")
    return path


def write_hf_mmproj(arch: str, out_dir: Path) -> Path:
    """Path of the tiny ``arch``'s vision projector GGUF (F32) under ``out_dir``, written by the
    converter's ``--mmproj`` from the same HF folder as the language model, made when missing or
    stale. Only a recipe with a ``preprocessor`` has one."""
    a = hf_arch(arch)
    if a.preprocessor is None:
        raise ValueError(f"the tiny {arch} has no vision projector (its recipe has no preprocessor)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"mmproj-{arch}-f32.gguf"
    recipe = _recipe(a, "mmproj-f32")
    with generation_lock(path):
        folder = _current_hf_folder(arch, a, out_dir)
        if _is_current(path, recipe):
            return path
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        try:
            _convert(folder, tmp, "f32", ("--mmproj",))
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        _sidecar(path).write_text(json.dumps({"recipe": recipe, "size": path.stat().st_size}) + "\n")
    return path


def _current_hf_folder(name: str, a: Recipe, out_dir: Path) -> Path:
    """The HF folder of recipe ``a``, rebuilt unless its stamp names this recipe. It is built under
    a temporary name and renamed into place, stamp included, so a folder is never half-written
    or stamped with a recipe it was not made from (two test runs may share the folder)."""
    folder = hf_dir(name, out_dir)
    with generation_lock(folder):
        return _current_hf_folder_locked(a, folder)


def _current_hf_folder_locked(a: Recipe, folder: Path) -> Path:
    recipe = _recipe(a, "hf")
    stamp = folder / "bmoe-recipe.json"
    try:
        if json.loads(stamp.read_text()).get("recipe") == recipe:
            return folder
    except (OSError, ValueError):
        pass
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    write_hf_model(a, tmp)
    (tmp / "bmoe-recipe.json").write_text(json.dumps({"recipe": recipe}) + "\n")
    old = folder.with_name(f"{folder.name}.old{os.getpid()}")
    if folder.exists():
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder


def _convert(folder: Path, dst: Path, outtype: str, extra: tuple[str, ...] = ()) -> None:
    cmd = [sys.executable, str(converter_path()), str(folder), "--outtype", outtype, "--outfile", str(dst), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not dst.is_file():
        tail = "\n".join((r.stderr or r.stdout).splitlines()[-25:])
        raise RuntimeError(f"convert_hf_to_gguf.py failed for {folder} ({outtype}), rc {r.returncode}:\n{tail}")
