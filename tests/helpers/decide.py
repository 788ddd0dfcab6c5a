"""The scripted decide backends and requests the decide unit tests share (no model).

``ScriptedBackend``'s "KV" is the list of prefill pieces it has seen, and its logits are a pure
function of that list: like llama.cpp, it answers differently for the same tokens prefilled in
different pieces. ``ForkingBackend`` adds side sequences (full scoring's forks).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence

import numpy as np

from bmoe.decide.decider import DecidePolicy, Decider
from bmoe.decide.port import SIDE_OFF, KeptPrefix, KeptState, PrefillCost, SideSequences
from bmoe.decide.service import DecideService
from bmoe.decide.types import DecideRequest
from bmoe.state_store import StateStore

# ---------------------------------------------------------------------------------------------
# Scripted backend

SPECIALS = ("<s>", "<u>", "<e>", "<a>")  # BOS, user open, end of message, assistant open
MERGES = ("ab", "abc", "Hello", " world", "Task", "Pick", "Yes")
CHARS = tuple(chr(c) for c in range(32, 127))
VOCAB = SPECIALS + CHARS + MERGES
TOKEN_ID = {piece: i for i, piece in enumerate(VOCAB)}
N_VOCAB = len(VOCAB)
BOS, USER, END, ASSISTANT = (TOKEN_ID[s] for s in SPECIALS)


def tokenize_text(text: str, *, specials: bool) -> list[int]:
    """Greedy longest match: a merge like "ab" swallows the join between "a" and "b"."""
    out: list[int] = []
    i = 0
    pieces = sorted(VOCAB if specials else CHARS + MERGES, key=len, reverse=True)
    while i < len(text):
        piece = next(p for p in pieces if text.startswith(p, i))
        out.append(TOKEN_ID[piece])
        i += len(piece)
    return out


class ScriptedFailure(RuntimeError):
    pass


class ScriptedBackend:
    """Implements both ports (``TextPort``, ``SequencePort``); records every call that touches the
    sequence."""

    def __init__(
        self,
        *,
        n_ctx: int = 512,
        template: bool = True,
        bos: bool = True,
        streaming: bool = False,
        batch: int = 1,
        expert_cache: bool = True,
    ) -> None:
        self._n_ctx = n_ctx
        self.batch = batch
        self.template = template
        self.bos = bos
        self.streaming = streaming
        self.expert_cache = expert_cache  # streamed: whether expert cache lookups are counted
        # streamed with the cache on: (hits, misses) of each prefill call in turn, then (1, 3) each
        self.lookups: list[tuple[int, int]] = []
        self.pieces: list[tuple[int, ...]] = []  # the "KV": what was prefilled, piece by piece
        self.calls: list[tuple[str, tuple[int, ...], int]] = []
        self.fail_on: str | None = None  # method name that raises once
        self.clear_copy_s = 0.0  # what clear() reports having spent copying a kept state out
        self.state_n_tokens_skew = 0  # a save_state that lies about its size
        self.held_bytes = 0  # what it holds for kept states: the last one saved (one buffer)
        self.kept: tuple[KeptPrefix, ...] = ()  # what the decider said it keeps (keep)

    # -- failure injection
    def _maybe_fail(self, name: str) -> None:
        if self.fail_on == name:
            self.fail_on = None
            raise ScriptedFailure(f"scripted failure in {name}")

    # -- PromptRenderer / ChoiceTokenizer
    def render_user(self, text: str, history: Sequence[tuple[str, str]] = ()) -> str:
        self._maybe_fail("render_user")
        before = "".join(f"<{'u' if r == 'user' else 'a'}>{c}<e>" for r, c in history)
        return before + (f"<u>{text}<e><a>" if self.template else text)

    def tokenize_prompts(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.tokenize_prompt(t) for t in texts]

    def tokenize_prompt(self, text: str) -> list[int]:
        self._maybe_fail("tokenize_prompt")
        return ([BOS] if self.bos else []) + tokenize_text(text, specials=True)

    def tokenize_choice(self, text: str) -> list[int]:
        return tokenize_text(text, specials=False)

    def token_piece(self, token: int) -> str:
        return VOCAB[token]

    # -- sequence
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def n_past(self) -> int:
        return sum(len(p) for p in self.pieces)

    def clear(self) -> float:
        self.calls.append(("clear", (), 0))
        self.pieces = []
        # A backend that keeps saved states in the sequence copies the kept one out here.
        return self.clear_copy_s

    def prefill(self, tokens: Sequence[int], n_past: int) -> PrefillCost:
        self.calls.append(("prefill", tuple(tokens), n_past))
        self._maybe_fail("prefill")
        assert n_past == self.n_past, "prefill must append at the end of the sequence"
        assert len(tokens) > 0
        self.pieces.append(tuple(tokens))
        return PrefillCost(n_tokens=len(tokens), prefill_s=0.25 * len(tokens), **self._reads(1.5 * len(tokens)))

    def _reads(self, read_mb: float) -> dict[str, float | None]:
        if not self.streaming:
            return {}
        hits, misses = (self.lookups.pop(0) if self.lookups else (1, 3)) if self.expert_cache else (None, None)
        return {"read_mb": read_mb, "cache_hits": hits, "cache_misses": misses}

    def last_logits(self) -> np.ndarray:
        return logits_of(self.pieces)

    def save_state(self) -> KeptState:
        self.calls.append(("save_state", (), self.n_past))
        self._maybe_fail("save_state")
        data = json.dumps([list(p) for p in self.pieces]).encode()
        self.held_bytes = len(data)
        return KeptState(data=data, n_tokens=self.n_past + self.state_n_tokens_skew)

    def load_state(self, state: KeptState) -> None:
        self.calls.append(("load_state", (), state.n_tokens))
        self._maybe_fail("load_state")
        self.pieces = [tuple(p) for p in json.loads(state.data)]

    def max_batch(self) -> int:
        return self.batch

    def prefill_batch(
        self, suffixes: Sequence[Sequence[int]], n_past: int, stop: Callable[[], bool] = lambda: False
    ) -> tuple[list[np.ndarray], PrefillCost]:
        self.calls.append(("prefill_batch", tuple(len(s) for s in suffixes), n_past))
        self._maybe_fail("prefill_batch")
        assert n_past == self.n_past and 0 < len(suffixes) <= self.batch
        # each suffix continues its own copy of the sequence, in one piece; the sequence stays
        rows = [logits_of(self.pieces + [tuple(s)]) for s in suffixes]
        n = sum(len(s) for s in suffixes)
        return rows, PrefillCost(n_tokens=n, prefill_s=0.1 * n, **self._reads(2.0 * n))

    def keep(self, kept: Sequence[KeptPrefix]) -> None:
        self.kept = tuple(kept)

    def forget(self) -> None:
        self.kept = ()

    # -- its side sequences are open from the start (``batch`` of them), so the decider never
    # opens them nor drops the kept state for them

    def side_sequences(self) -> SideSequences:
        return SideSequences(self.batch, self.batch)

    def open_side_sequences(self) -> int:
        raise AssertionError("the scripted backend's side sequences are open from the start")

    def touched(self) -> list[str]:
        return [c[0] for c in self.calls]


def decide_service(backend: ScriptedBackend, *, keep_prefix: bool = True, **kw: int) -> DecideService:
    """The service a session holds, over one scripted backend standing for both ports."""
    return DecideService(
        Decider(backend, backend, DecidePolicy(keep_prefix=keep_prefix), StateStore.last_prefix()), **kw
    )


def logits_of(pieces: Sequence[tuple[int, ...]]) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(repr(list(pieces)).encode(), digest_size=8).digest(), "little")
    return (np.random.default_rng(seed).standard_normal(N_VOCAB) * 3.0).astype(np.float32)


def prompt_tokens(text: str) -> list[int]:
    return [BOS] + tokenize_text(f"<u>{text}<e><a>", specials=True)


def hand_logp(row: np.ndarray, token: int) -> float:
    x = [float(v) for v in row]
    m = max(x)
    return x[token] - m - math.log(math.fsum(math.exp(v - m) for v in x))


PREFIX, SUFFIX = "Task: x. ", " Pick one."
# "ab" and "abx" share their first token (refused under "first"); "Hello world" is two merges
FULL_CHOICES = ("ab", "abx", "Hello world", "c")


class ForkingBackend(ScriptedBackend):
    def __init__(self, *, forks: int = 4, sides: SideSequences | None = None, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.forks = forks
        self.sides = sides  # what side_sequences() says; by default forks open, or none (decide_batch 1)

    def max_forks(self) -> int:
        return self.forks

    def side_sequences(self) -> SideSequences:
        return self.sides or SideSequences(self.forks, self.forks, "" if self.forks else SIDE_OFF)

    def prefill_forks(
        self, continuations: Sequence[Sequence[int]], n_past: int, base: KeptState | None = None
    ) -> tuple[list[np.ndarray], PrefillCost]:
        self.calls.append(("prefill_forks", tuple(len(c) for c in continuations), n_past))
        self._maybe_fail("prefill_forks")
        assert 0 < len(continuations) <= self.forks and all(continuations)
        if base is None:
            assert n_past == self.n_past
            pieces = list(self.pieces)
        else:
            pieces = [tuple(p) for p in json.loads(base.data)]
            assert n_past == base.n_tokens == sum(len(p) for p in pieces)
        rows = [fork_rows(pieces, c) for c in continuations]
        n = sum(len(c) for c in continuations)
        return rows, PrefillCost(n_tokens=n, prefill_s=0.01 * n, read_mb=0.5 * n if self.streaming else None)

    def prefill_apart(self, tokens: Sequence[int]) -> tuple[np.ndarray, KeptState, PrefillCost]:
        self.calls.append(("prefill_apart", tuple(tokens), 0))
        self._maybe_fail("prefill_apart")
        pieces = [tuple(tokens)]
        state = KeptState(data=json.dumps([list(tokens)]).encode(), n_tokens=len(tokens))
        return logits_of(pieces), state, PrefillCost(n_tokens=len(tokens), prefill_s=0.02 * len(tokens))


def fork_rows(pieces: Sequence[tuple[int, ...]], continuation: Sequence[int]) -> np.ndarray:
    """Rows after each token of ``continuation`` prefilled as one piece after ``pieces``."""
    piece = tuple(continuation)
    return np.stack([logits_of(list(pieces) + [piece, (-1, j)]) for j in range(len(piece))])


def full(choices: tuple[str, ...] = FULL_CHOICES, **kw: object) -> DecideRequest:
    kw.setdefault("id", 1)
    kw.setdefault("scoring", "full")
    return DecideRequest(prefix=PREFIX, suffix=SUFFIX, choices=choices, **kw)  # type: ignore[arg-type]
