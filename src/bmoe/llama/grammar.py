"""The grammar engine's view of a model's vocabulary (adapter over llama.cpp for llguidance).

llguidance needs every token's bytes and the model's tokenizer; reading them takes about a
second, so the caller builds it once per model and keeps it (the runtime does).
"""

from __future__ import annotations

import warnings

from llguidance import LLTokenizer
from llguidance.llamacpp import lltokenizer_from_vocab

from bmoe.llama.model import LlamaModel


def grammar_tokenizer(model: LlamaModel) -> LLTokenizer:
    """The llguidance tokenizer of ``model``'s vocabulary; its EOS is the model's."""
    with warnings.catch_warnings():  # it reads each token's attributes by the bindings' deprecated name
        warnings.simplefilter("ignore", DeprecationWarning)
        return lltokenizer_from_vocab(model.vocab, n_vocab=model.n_vocab, eos_token=model.eos)
