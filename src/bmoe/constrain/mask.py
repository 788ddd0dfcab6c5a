"""The per-step side of a constraint: which tokens may come next, over one logit row.

``TokenMask`` wraps llguidance's matcher for one answer. The generate loop calls ``mask(logits)``
before it samples (greedy or not), ``advance(token)`` after, and stops when ``done()``. The
vocabulary comes as an ``LLTokenizer`` the engine adapter builds (bmoe.llama.grammar); the EOS
token it names is the one the matcher allows once the answer is complete.
"""

from __future__ import annotations

import numpy as np
from llguidance import LLMatcher, LLTokenizer

from bmoe.constrain.constraint import Constraint
from bmoe.constrain.schema import ConstraintError
from bmoe.errors import EngineFailure


class TokenMask:
    def __init__(self, tokenizer: LLTokenizer, constraint: Constraint, n_vocab: int) -> None:
        self.field = constraint.field
        self.matcher = LLMatcher(tokenizer, constraint.grammar, log_level=0)
        if self.matcher.is_error():
            raise ConstraintError(self.field, " ".join(self.matcher.get_error().split()))
        self.n_vocab = n_vocab
        self._bits = np.zeros((tokenizer.vocab_size + 31) // 32, dtype=np.int32)
        self._allowed = self._compute()
        if not self._allowed[:n_vocab].any():
            raise ConstraintError(self.field, "accepts no text at all (not even an empty answer)")

    def _compute(self) -> np.ndarray:
        """The allowed tokens, a bool row of the tokenizer's vocabulary size."""
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little").astype(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits  # [n_vocab]`` with every token the constraint forbids at -inf (a new row)."""
        allowed = self._allowed[: logits.shape[0]]
        if allowed.shape[0] < logits.shape[0]:
            allowed = np.concatenate([allowed, np.zeros(logits.shape[0] - allowed.shape[0], dtype=bool)])
        return np.where(allowed, logits, np.float32(-np.inf)).astype(logits.dtype, copy=False)

    def advance(self, token: int) -> bool:
        """Take the sampled ``token``; True when the answer is complete and nothing may follow
        (``done``), else the next mask is computed."""
        if not self.matcher.consume_token(token):
            raise EngineFailure(f"the grammar matcher refused token {token}: {self.matcher.get_error()}")
        if self.done():
            return True
        self._allowed = self._compute()
        return False

    def allowed_ids(self) -> np.ndarray:
        """The token ids the constraint allows next ``# [n]`` int64, ascending."""
        return np.flatnonzero(self._allowed[: self.n_vocab])

    def accepts(self, tokens: list[int]) -> bool:
        """Whether the constraint takes all of ``tokens`` next (nothing is consumed)."""
        return self.matcher.validate_tokens(tokens) == len(tokens)

    def forced(self, most: int) -> list[int]:
        """Up to ``most`` tokens the constraint forces next, whatever the logits (jump-forward:
        keys and punctuation of a schema); they are still to be ``advance``d one by one."""
        return self.matcher.compute_ff_tokens()[: max(0, most)] if most > 0 else []

    def done(self) -> bool:
        """The answer is complete and nothing may follow."""
        return self.matcher.is_stopped()
