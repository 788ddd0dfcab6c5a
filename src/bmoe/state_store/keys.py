"""What a kept state is keyed by: its tokens, and the identity of the model that computed it.

A state is only valid for the model file it was computed with, the settings that shape the state
(context size, KV types, ...) and the llama.cpp build that wrote its bytes. ``ModelIdentity``
joins the three into one digest; a disk tier keeps its files in a folder named by it and writes
it into each file's header, so a state of another model, setting or build is never read back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """``model``: the model file's identity (path, size, modification time: whatever changes when
    the file does); ``settings``: the settings that change a state's bytes or meaning; ``build``:
    the llama.cpp build that saves and loads the bytes."""

    model: str
    settings: tuple[tuple[str, str], ...]
    build: str

    @classmethod
    def of(cls, model: str, settings: Mapping[str, object], build: str) -> ModelIdentity:
        return cls(model=model, settings=tuple(sorted((k, str(v)) for k, v in settings.items())), build=build)

    def digest(self) -> bytes:
        """sha256 over the three, 32 bytes."""
        text = json.dumps({"model": self.model, "settings": list(self.settings), "build": self.build})
        return hashlib.sha256(text.encode()).digest()


def tokens_bytes(tokens: Sequence[int]) -> bytes:
    """The tokens as the disk tier writes them: little-endian int64 (image positions are negative)."""
    return np.asarray(tokens, dtype="<i8").tobytes()


def state_name(identity: bytes, tokens: Sequence[int]) -> str:
    """The file name of a state: a digest of the model identity and the tokens."""
    return hashlib.sha256(identity + tokens_bytes(tokens)).hexdigest()[:40] + ".state"
