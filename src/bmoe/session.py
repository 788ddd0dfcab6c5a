"""Session: the public face over one Runtime, and the one door the edges use into the engine.

One request runs at a time (a lock); cancel() may come from any thread and takes effect at the
next decode boundary (a decision list's: its next decision, or its batch's next llama_decode call). A refused request raises RequestError before anything in the session
changes. A streaming failure is sticky: every later call raises the same StreamFailedError.

The edges (bmoe-cli, bmoe-server, bmoe-eval, bmoe-batch and bmoe.ray.data) import the engine's
requests, results and ``Message`` from here (``__all__``), never from ``bmoe.runtime``,
``bmoe.llama`` or ``bmoe.stream``; what needs no session (a config's footprint and plan, the
streamable architectures, the devices, the dense twins' garbage collection) from ``bmoe.tools``.
An import-linter contract and tests/unit/test_public_door.py hold them to it.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Callable, Generator, Iterator

import numpy as np

from bmoe.config import SessionConfig
from bmoe.decide.decider import DecidePolicy, Decider
from bmoe.decide.kept_prefix import resolve_keep_prefix
from bmoe.decide.service import DecideService
from bmoe.decide.types import DecideRequest, DecideResult
from bmoe.errors import EngineFailure, RequestError, SessionClosedError, StreamFailedError
from bmoe.image_refs import ImageSource
from bmoe.llama.model import LlamaModel
from bmoe.rules import TOP_CAP
from bmoe.runtime.chat import ChatRenderer, Message
from bmoe.runtime.chat_state import prepare_turn
from bmoe.runtime.choice import ChoiceWalk, walk_choices
from bmoe.runtime.decide import LlamaSequence
from bmoe.runtime.decide_text import LlamaText
from bmoe.runtime.expert_streaming import ExpertStreaming
from bmoe.runtime.kv import KvSequence
from bmoe.runtime.plan import Plan, make_plan
from bmoe.runtime.results import (
    GenerateRequest,
    GenerateResult,
    PerplexityResult,
    ScoreRequest,
    ScoreResult,
    Step,
    check_generate,
)
from bmoe.runtime.runtime import Runtime
from bmoe.runtime.sampling import check_sampling
from bmoe.runtime.state_store_open import open_state_store
from bmoe.runtime.turn import Turn
from bmoe.state_store import StateStore, StoreCounts
from bmoe.stream.stats import StreamStats

# What other packages may use (a test holds them to it): the session, its requests and results
# and what they carry. The edges' utilities that need no session are bmoe.tools'.
__all__ = [
    "DECIDE_OFF",
    "TOP_CAP",
    "DecideOffError",
    "DecideRequest",
    "DecideResult",
    "GenerateRequest",
    "GenerateResult",
    "Message",
    "PerplexityResult",
    "ScoreRequest",
    "ScoreResult",
    "Session",
    "Step",
    "StreamStats",
]

DECIDE_OFF = "decide is off in this session: open it with --decide (SessionConfig.decide=True)"


class DecideOffError(RequestError):
    """A decision asked of a session opened without decide (the one check: the edges answer it)."""


CLOSE_WAIT_S = 600.0  # close(): how long a running request may still take before the model is left unfreed


def plan_for(config: SessionConfig) -> Plan | None:
    """The plan a session of ``config`` opens with (docs/plan.md): None with plan off, or where the
    model's header cannot be read (the open then names what is wrong with the file)."""
    if config.plan == "off":
        return None
    try:
        return make_plan(config)
    except (OSError, ValueError):
        return None


class Session:
    def __init__(self, config: SessionConfig) -> None:
        self.plan = plan_for(config)
        if self.plan is not None:
            config = self.plan.config
        self.config = config
        self.runtime = Runtime(config)
        # Only sessions opened with decide on allocate its state.
        try:
            self.decider = self._open_decide(config, self.runtime) if config.decide else None
        except BaseException:
            self.runtime.close()
            raise
        # Reentrant: close() on the thread of a generation it abandoned mid-way (the generator holds
        # the lock while suspended) must not wait for itself.
        self._lock = threading.RLock()
        self._cancel = threading.Event()
        self._running = False
        self._closed = False
        self._broken: StreamFailedError | None = None

    @staticmethod
    def _open_decide(config: SessionConfig, runtime: Runtime) -> DecideService:
        """Decide's adapters over the runtime, the decider over them, and debiasing around it."""
        keep = resolve_keep_prefix(config.decide_prefix_cache, prefill_device=config.prefill_device is not None)
        store, note = open_state_store(config)
        if note:
            print(note, file=sys.stderr)
        return DecideService(
            Decider(LlamaText(runtime), LlamaSequence(runtime), DecidePolicy(keep_prefix=keep), store),
            pride_sample=config.decide_pride_sample,
            max_work=config.decide_max_work,
        )

    # --- facts ------------------------------------------------------------------------
    @property
    def model(self) -> LlamaModel:
        return self.runtime.model

    @property
    def kv(self) -> KvSequence:
        return self.runtime.kv

    @property
    def chat(self) -> ChatRenderer:
        return self.runtime.chat

    @property
    def history(self) -> list[Message]:
        return self.runtime.history

    @property
    def n_ctx(self) -> int:
        return self.runtime.n_ctx

    @property
    def load_s(self) -> float:
        return self.runtime.load_s

    @property
    def load_read_bytes(self) -> int:
        return self.runtime.load_read_bytes

    @property
    def streaming(self) -> ExpertStreaming | None:
        """The live expert streaming of a --moe-stream session (its layout, counters, hook); None
        for a resident model."""
        return self.runtime.stream

    @property
    def dense_anon_bytes(self) -> int:
        """Bytes of dense weights held in anonymous memory (--dense-weights anon, the default when
        streaming); 0 with mmap or resident."""
        return self.runtime.dense_anon_bytes

    def dense_resident_frac(self) -> float:
        """Fraction of the dense (non-expert) weights in RAM; 0 where unmeasured (resident runs)."""
        return self.runtime.dense_resident_frac()

    def stream_stats(self) -> StreamStats:
        """Cumulative streaming counters since open (subtract two for a span); zero when resident."""
        return self.runtime.stream_stats()

    # --- prompts ----------------------------------------------------------------------
    def render(self, messages: list[Message], *, think: bool) -> str:
        return self.runtime.render(messages, think=think)

    def tokenize_prompt(self, text: str, images: Sequence[ImageSource] = ()) -> list[int]:
        """Tokenize a prompt, BOS as the model asks: one ``render`` gave with special tokens
        parsed in the template's markup only (a message's text is plain text), any other text
        with special tokens parsed throughout (a raw prompt). ``images`` (file paths, data:
        URLs or bytes) stand at its image markers, in order, as the runs of placeholder ids (negative)
        their tokens are; a RequestError names an image that cannot be read."""
        if not images:
            return self.runtime.tokenize_prompt(text)
        self._check_open()
        with self._lock:
            return self.runtime.tokenize_prompt(text, self.runtime.read_images(images))

    # --- generate ---------------------------------------------------------------------
    def set_history(self, messages: list[Message]) -> None:
        """Start a conversation from a transcript. The next clear_kv=False turn re-renders it and
        reuses whatever prefix of it the KV already holds (decided on tokens, as every turn)."""
        self._check_open()
        with self._lock:
            self.runtime.history = list(messages)

    def prompt_length(self, request: GenerateRequest, history: Sequence[Message]) -> int:
        """How many tokens ``request``'s prompt would be as the turn after ``history`` (rendered
        and tokenized as ``generate`` would: its tools, reasoning switch and constraint), without
        prefilling it or changing the history; a RequestError names an image that cannot be read."""
        self._check_open()
        with self._lock:
            return self.runtime.prompt_length(request, history)

    def cancel(self) -> None:
        """Interrupt the generation in flight at its next decode boundary, or the decision list in
        flight at its next decision or batch call (no-op when idle)."""
        event = self._cancel  # the event of the run in flight, or of one that ended: never the next one's
        if self._running:
            event.set()

    def generate(self, request: GenerateRequest, on_step: Callable[[Step], None] | None = None) -> GenerateResult:
        it = self.generate_iter(request)
        while True:
            try:
                step = next(it)
            except StopIteration as stop:
                return stop.value
            if on_step is not None:
                on_step(step)

    def generate_iter(
        self,
        request: GenerateRequest,
        *,
        cancel: threading.Event | None = None,
        tokens: Sequence[int] | None = None,
    ) -> Generator[Step, None, GenerateResult]:
        """Yield one Step per generated token; the generator's return value is the result.

        ``cancel``: an event of the caller's, one per request, that cancels this request when it
        is set, even before the request starts (it then stops before its first token); cancel()
        sets it too. Without one, only cancel() does. ``tokens``: a raw prompt, given to the model
        as it is instead of ``request.prompt`` as a chat turn; the chat history stays as it was
        (runtime/raw_prompt.py)."""
        self._check_open()
        with self._lock, self._engine():
            check_generate(request)
            check_sampling(request.top_logprobs, request.logit_bias, self.model.n_vocab)
            turn = self.runtime.prepare(request) if tokens is None else self.runtime.prepare_raw(request, tokens)
            if self.decider is not None:
                self.decider.drop()  # the kept decision state is only worth its RAM between decisions
            self._side_sequences_for(turn)
            reuse = None
            if self.decider is not None and tokens is None:
                turn, reuse = prepare_turn(self.runtime, self.decider.decider, turn)
            self._cancel = (
                cancel if cancel is not None else threading.Event()
            )  # a cancel() of an earlier run cannot reach it
            self._running = True
            try:
                result = yield from self.runtime.run(turn, self._cancel)
            finally:
                self._running = False
            return result if reuse is None else reuse.account(result)

    def _side_sequences_for(self, turn: Turn) -> None:
        """A tool turn's name decision scores on side sequences (runtime/tool_choice.py): opened
        before the prompt is prefilled (opening re-creates the context); without them, or with
        decide off, the name is generated token by token as any answer."""
        pick = turn.pick
        if pick is None or not pick.score:
            return
        if self.decider is None:
            pick.off("decide is off (--no-decide)")
            return
        self.decider.decider.open_side_sequences()
        if not self.runtime.side_sequences:
            pick.off("no side sequences (--decide-batch 1, or no memory for them)")

    def walk_choices(
        self, request: GenerateRequest, texts: Sequence[str], *, tokens: Sequence[int] | None = None
    ) -> ChoiceWalk:
        """Constrained greedy's answer to ``request`` (temperature 0) when its constraint allows
        only ``texts``, decoded only until one text is left (runtime/choice.py); ``tokens``: a
        raw prompt, as generate_iter takes one."""
        self._check_open()
        with self._lock, self._engine():
            check_generate(request)
            turn = self.runtime.prepare(request) if tokens is None else self.runtime.prepare_raw(request, tokens)
            if self.decider is not None:  # as generate_iter: the same KV, so the same logits
                self.decider.drop()
                if tokens is None:
                    prepare_turn(self.runtime, self.decider.decider, turn)
            return walk_choices(self.runtime, turn, texts)

    # --- scoring ----------------------------------------------------------------------
    def next_token_logprobs(self, tokens: list[int]) -> np.ndarray:
        """log-softmax of the next-token logits after ``tokens``, prefilled whole in a fresh KV."""
        self._check_open()
        with self._lock, self._engine():
            return self.runtime.next_token_logprobs(tokens)

    def perplexity(
        self,
        text: str | None = None,
        *,
        tokens: list[int] | None = None,
        n_window: int | None = None,
        keep_logits: bool = False,
    ) -> PerplexityResult:
        """Perplexity of ``text`` (tokenized as a prompt) or of already tokenized ``tokens``."""
        self._check_open()
        with self._lock, self._engine():
            return self.runtime.perplexity(text, tokens, n_window, keep_logits)

    def score(self, request: ScoreRequest) -> ScoreResult:
        """log p of every prompt token given the ones before it (and the top alternatives), and
        optionally one picked next token. Consecutive requests sharing a prefix reuse its KV and
        its scores (runtime/scoring.py); ``request.reuse=False`` prefills from an empty KV."""
        self._check_open()
        with self._lock, self._engine():
            self.runtime.scorer.check(request)  # refuse before the decide state is dropped
            if self.decider is not None:
                self.decider.drop()  # as for a generation: the kept decision state is only worth its RAM between decisions
            return self.runtime.score(request)

    def check_score(self, request: ScoreRequest) -> None:
        """Raise the RequestError score() would refuse ``request`` with; change nothing."""
        self._check_open()
        self.runtime.scorer.check(request)

    # --- decide -----------------------------------------------------------------------
    def decide(self, request: DecideRequest, *, cancel: threading.Event | None = None) -> DecideResult:
        [result] = self.decide_many([request], cancel=cancel)
        return result

    def decide_many(
        self, requests: Sequence[DecideRequest], *, cancel: threading.Event | None = None
    ) -> list[DecideResult]:
        """One answer per request, in order. ``cancel`` (an event of the caller's, as for
        ``generate_iter``) or ``cancel()`` stops the list between decisions and between the
        llama_decode calls of a batch: what has not run is answered as cancelled."""
        self._check_open()
        if self.decider is None:
            raise DecideOffError(DECIDE_OFF)
        with self._lock:
            self._cancel = cancel if cancel is not None else threading.Event()
            self._running = True
            try:
                results = self.decider.answer(requests, stop=self._cancel.is_set)
            finally:
                self._running = False
            return [self._check_decide(r) for r in results]

    # --- lifecycle --------------------------------------------------------------------
    def stats(self) -> dict[str, object]:
        io = self.stream_stats()
        return {
            "n_past": self.kv.n_past,
            "n_ctx": self.n_ctx,
            "streaming": self.runtime.stream is not None,
            "read_mib": io.read_bytes / 2**20,
            "cache_hit_pct": io.hit_pct,
            "hits": io.hits,
            "misses": io.misses,
            "routed": io.routed,
            "evictions": io.evictions,
            "cache_resident_mib": io.resident_bytes / 2**20,
            "cache_budget_mib": io.budget_bytes / 2**20,
            "side_sequences": self.runtime.side_sequences,
            "state_store": self._state_stats(),
        }

    def _state_stats(self) -> dict[str, int]:
        counts = self.state_counts()
        return {} if counts is None else dataclasses.asdict(counts)

    def state_counts(self) -> StoreCounts | None:
        """The store of kept prefix states' counters (``/metrics``); None without decide."""
        store = self.decider.decider.store if self.decider is not None else None
        return store.counts() if isinstance(store, StateStore) else None

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError("the session is closed")
        if self._broken is not None:
            raise self._broken

    @contextmanager
    def _engine(self) -> Iterator[None]:
        """Turn an engine failure (a streaming read error, a broken hook) into the session's
        sticky error."""
        try:
            yield
        except EngineFailure as e:
            self._broken = StreamFailedError(
                f"expert streaming failed: {e}; this session cannot continue, open a new one"
            )
            raise self._broken from e

    def _check_decide(self, result: DecideResult) -> DecideResult:
        if isinstance(result.cause, EngineFailure):
            with self._engine():
                raise result.cause
        return result

    def close(self) -> None:
        """Free the model. A request still running on another thread is cancelled and waited
        for first: its llama context must not be freed under it."""
        if self._closed:
            return
        self.cancel()
        if not self._lock.acquire(timeout=CLOSE_WAIT_S):  # a prefill or decision cannot be cancelled
            self._closed = True
            print(
                f"bmoe: a request still ran {CLOSE_WAIT_S:.0f} s after close(); the model is left to the "
                "process's exit rather than freed under it",
                file=sys.stderr,
            )
            return
        try:
            if not self._closed:
                self._closed = True
                if self.decider is not None:
                    self.decider.decider.save_kept()
                self.runtime.close()
        finally:
            self._lock.release()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
