"""Runtime: one loaded model and everything that computes with it.

The model, its context, the KV bookkeeping, the chat renderer and (with --moe-stream) the
streaming wiring, opened together from a valid SessionConfig. It runs one generation turn, a
scoring prefill or a perplexity pass at a time; it has no lock and knows nothing of cancelling
requests from other threads or of failures that outlive a call: the Session adds those.

Side sequences (decide's batches and full scoring) are opened with the context when
``decide_batch`` is a number, or later, when decide first needs them (``decide_batch`` auto):
``open_side_sequences`` then re-creates the context with more sequences, as many as fit in half
of the memory the process may still allocate (``side_room``).
"""

from __future__ import annotations

import dataclasses
import resource
import threading
import time
from pathlib import Path
from typing import Callable, Generator, NamedTuple, Sequence

import numpy as np
from llguidance import LLTokenizer

from bmoe import rules
from bmoe.config import SessionConfig
from bmoe.constrain import Constraint, TokenMask, constraint_of
from bmoe.errors import BmoeError, ContextOverflowError, EngineFailure, RequestError
from bmoe.image_refs import ImageSource
from bmoe.llama.context import ContextParams, LlamaContext
from bmoe.llama.devices import open_prefill_device
from bmoe.llama.grammar import grammar_tokenizer
from bmoe.llama.model import LlamaModel, ModelLoadParams
from bmoe.llama.mtmd import Image, ImageError, Projector
from bmoe.numerics import log_softmax
from bmoe.runtime.chat import ChatRenderer, Message, Prompt, Rendered
from bmoe.runtime.detokenize import Detokenizer
from bmoe.runtime.expert_streaming import ExpertStreaming, open_streaming
from bmoe.runtime.footprint import kv_bytes_per_sequence
from bmoe.runtime.images import ImageRuns, split_at_markers
from bmoe.runtime.kv import KvSequence
from bmoe.runtime.opening import check_opening
from bmoe.runtime.perplexity import perplexity as _perplexity
from bmoe.runtime.raw_prompt import prepare_raw
from bmoe.runtime.results import (
    GenerateRequest,
    GenerateResult,
    PerplexityResult,
    ScoreRequest,
    ScoreResult,
    Step,
    TimeSplit,
)
from bmoe.runtime.sampling import Sampler
from bmoe.runtime.scoring import PromptScorer, check_token_ids, token_logprobs
from bmoe.runtime.tool_choice import banned, name_pick
from bmoe.runtime.tool_turn import (
    answer_open,
    name_block,
    reasoning_split,
    shown_tokens,
    special_markers,
    thinks,
    tool_grammar,
)
from bmoe.runtime.turn import Turn
from bmoe.stream.budget import available_bytes
from bmoe.stream.stats import StreamStats


def _storage_read_bytes() -> int:
    """Bytes this process has fetched from storage (page-cache hits excluded); 0 where unknown."""
    try:
        with open("/proc/self/io", "rb") as f:
            for line in f:
                if line.startswith(b"read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _rusage() -> tuple[int, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_majflt, ru.ru_utime + ru.ru_stime


class SideRoom(NamedTuple):
    """Room for side sequences: how many ``open_side_sequences`` may open now (``n``), what one
    takes (``kv_bytes``: one more sequence's KV) and the room they may take together
    (``room_bytes``: half of what the process may still allocate)."""

    n: int
    kv_bytes: int
    room_bytes: int


class SideSequencesError(BmoeError):
    """The context could not be re-created with side sequences; it was re-created as it was."""


class ContextLostError(EngineFailure):
    """The context could be re-created neither with side sequences nor as it was."""


class Runtime:
    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        # What the process may still allocate, in bytes (MemAvailable capped by the cgroup's
        # headroom); side_room() halves it. An attribute so that tests can give a machine.
        self.available_bytes: Callable[[], int] = available_bytes
        self._kv_per_sequence: int | None = None
        t0, read0 = time.perf_counter(), _storage_read_bytes()
        # refused here, before anything is opened or written (open_streaming runs the streaming checks)
        overrides = check_opening(config, streaming=False)
        # First: the device backends fix their offload threshold when the registry is first read.
        self.prefill_device = (
            open_prefill_device(config.prefill_device, config.prefill_min_tokens)
            if config.prefill_device is not None
            else None
        )
        self.stream: ExpertStreaming | None = open_streaming(config) if config.moe_stream else None
        try:
            self.model = LlamaModel(
                ModelLoadParams(
                    path=self.stream.load_path if self.stream is not None else config.model,
                    prefill_device=self.prefill_device,
                    user_path=config.model,
                    anon_ranges=self.stream.anon_ranges if self.stream is not None else (),
                    unused_ranges=self.stream.expert_files if self.stream is not None else (),
                    int_overrides=overrides,
                )
            )
        except BaseException:
            if self.stream is not None:
                self.stream.close()
            raise
        if self.stream is not None:
            try:
                self.stream.attach(self.model.anon)
            except BaseException:  # the model is loaded by now: its weights must not stay behind
                self.stream.close()
                self.model.close()
                raise
        self.ctx: LlamaContext | None = None
        self._grammar_tok: LLTokenizer | None = None  # llguidance's view of the vocabulary, built on first use
        self.images: ImageRuns | None = None
        try:
            self._open_rest(config)
        except BaseException:  # nothing opened so far stays behind (a model's anonymous pages are GBs)
            self.close()
            raise
        self.load_s = time.perf_counter() - t0
        self.load_read_bytes = _storage_read_bytes() - read0  # from flash while opening (dense weights)

    def _open_rest(self, config: SessionConfig) -> None:
        """The context, the warm-up a prefill device needs, and the chat template: what opening
        does after the model loaded (``__init__`` frees everything if any of it fails)."""
        if config.mmproj is not None:  # resident, beside a streamed or resident language model
            self.images = ImageRuns(
                Projector(Path(config.mmproj), self.model, n_threads=config.threads, flash_attn=config.flash_attn)
            )
        self._open_context(config.n_seq_at_open)
        self._bos_text = self.model.token_bytes(self.model.bos, special=True).decode("utf-8", "replace")
        eos_text = self.model.token_bytes(self.model.eos, special=True).decode("utf-8", "replace")
        self.chat = ChatRenderer(config.chat, self.model.chat_template(), self._bos_text, eos_text)
        self.history: list[Message] = []

    @property
    def live_ctx(self) -> LlamaContext:
        """The context, which exists from open to close."""
        if self.ctx is None:
            raise EngineFailure("the session's context is closed")
        return self.ctx

    def _open_context(self, n_seq: int) -> None:
        """A context of ``n_seq`` sequences, and what is bound to it: the KV bookkeeping, the
        prompt scorer and, with streaming and a prefill device, the warm-up."""
        config = self.config
        ctx = LlamaContext(
            self.model,
            ContextParams(
                n_ctx=config.n_ctx,
                n_batch=config.n_batch,
                n_ubatch=config.n_ubatch,
                n_threads=config.threads,
                n_threads_batch=config.threads,
                flash_attn=config.flash_attn,
                kv_f32=config.kv_f32,
                offload_min_tokens=self.prefill_device.min_tokens if self.prefill_device is not None else None,
                n_seq=n_seq,
            ),
            # The same hook: what it keeps between graphs belongs to the model (the weights it
            # rebound, the order it learned), not to a context.
            eval_callback=self.stream.hook if self.stream is not None else None,  # type: ignore[arg-type]
        )
        kv = KvSequence(ctx, self.images)
        if self.stream is not None and self.prefill_device is not None:
            # The hook binds streamed experts when a CPU graph first reads them; a device graph
            # reads copies taken before its nodes run. One CPU-wide token binds every layer first.
            try:
                kv.append([max(0, self.model.bos)])
                kv.reset()
            except BaseException:
                ctx.close()
                raise
        self.ctx, self.kv = ctx, kv
        self.scorer = PromptScorer(kv, self.model)

    # --- side sequences ---------------------------------------------------------------
    @property
    def side_sequences(self) -> int:
        """Side sequences the context holds beside seq 0 (0 until they are opened)."""
        return self.live_ctx.n_seq - 1

    def side_room(self) -> SideRoom:
        """How many side sequences ``open_side_sequences`` may open now: the config's most
        (``n_seq_max - 1``: 8 for decide_batch auto, 0 for 1), fewer where their KV does not fit
        in half of what the process may still allocate."""
        if self._kv_per_sequence is None:
            self._kv_per_sequence = kv_bytes_per_sequence(self.config.model, self.config.n_ctx, self.config.kv_f32)
        kv = max(1, self._kv_per_sequence)
        room = max(0, self.available_bytes()) // 2
        return SideRoom(n=min(self.config.n_seq_max - 1, room // kv), kv_bytes=kv, room_bytes=room)

    def open_side_sequences(self, n: int) -> None:
        """Re-create the context with seq 0 and ``n`` side sequences, freeing the old one first.

        What the old context held is lost: the KV bookkeeping and the prompt scorer start empty
        (a guard on the KV is told first, as before any clear). The chat history stays; the next
        turn finds nothing in the KV to reuse and prefills it whole. If llama.cpp refuses the new
        context, the old shape is re-created and ``SideSequencesError`` raised; if that fails
        too, ``ContextLostError`` (the session cannot go on)."""
        if n < 1 or self.side_sequences:
            raise ValueError(
                f"open_side_sequences: {n} side sequences on a context holding {self.live_ctx.n_seq} sequences"
            )
        old_n_seq = self.live_ctx.n_seq
        self.kv.reset()
        self.live_ctx.close()
        try:
            self._open_context(n + 1)
        except Exception as exc:
            try:
                self._open_context(old_n_seq)
            except Exception as again:
                raise ContextLostError(
                    f"the context could not be re-created after opening {n} side sequences failed ({exc}): {again}"
                ) from again
            raise SideSequencesError(
                f"llama.cpp could not create a context of {n + 1} sequences of {self.config.n_ctx} tokens: {exc}"
            ) from exc

    # --- facts ------------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return self.live_ctx.n_ctx

    def dense_resident_frac(self) -> float:
        """Fraction of the dense (non-expert) weights in RAM; 0 where unmeasured (resident runs)."""
        return self.stream.dense_resident_frac() if self.stream is not None else 0.0

    @property
    def dense_anon_bytes(self) -> int:
        """Bytes of dense weights held in anonymous memory (--dense-weights anon); 0 otherwise."""
        return self.stream.dense_anon_bytes if self.stream is not None else 0

    def stream_stats(self) -> StreamStats:
        """Cumulative streaming counters since open; all zero for a resident model."""
        return self.stream.stats() if self.stream is not None else StreamStats()

    # --- prompts ----------------------------------------------------------------------
    def render(self, messages: list[Message], *, think: bool) -> Prompt:
        return self.chat.render(messages, think=think)

    def read_images(self, sources: Sequence[ImageSource]) -> list[Image]:
        """A request's images (file paths, data: URLs or bytes), read and tokenized by the projector: a
        RequestError naming the image, or the missing --mmproj, before anything is prefilled."""
        if not sources:
            return []
        if self.images is None:
            raise ImageError(
                "images: this session has no vision projector; open it with --mmproj FILE "
                "(SessionConfig.mmproj), the model's projector GGUF"
            )
        return self.images.read(sources, self.n_ctx)

    def tokenize_prompt(self, text: str, images: Sequence[Image] = ()) -> list[int]:
        """Tokenize a prompt, BOS as the model asks. A rendered one (``chat.Prompt``): special
        tokens parsed in the template's markup only, the messages' own text read as plain text,
        so a special token's text a message holds is never that token (llama/markup.py). Any
        other text (a raw prompt, perplexity's text) is the client's own markup: special tokens
        parsed throughout, as llama.cpp's raw prompt."""
        if isinstance(text, Prompt):
            for content in text.unplaced:
                if self.model.holds_control_text(content):
                    raise RequestError(
                        "a message holds a special token's text, and this model's chat template "
                        "renders messages in a way bmoe cannot tell apart from its own markup, so it "
                        "could not keep that text plain; remove it, or run with --chatml"
                    )
            parts = text.parts
        else:
            parts = ((text, False),)
        if images:
            raw = self.chat.mode == "none" or not isinstance(text, Prompt)  # markers anywhere are the client's
            toks = self._tokens_with_images(parts, images, raw=raw)
        else:
            toks = self.model.tokenize_parts(parts)
        # A BOS the template wrote is the prompt's own; one written in a message's text is text.
        starts = bool(self._bos_text) and text.startswith(self._bos_text)
        if starts and parts and parts[0][1]:
            starts = toks[:1] == [self.model.bos]
        return [self.model.bos] + toks if self.model.add_bos and not starts else toks

    def _tokens_with_images(
        self, parts: Sequence[tuple[str, bool]], images: Sequence[Image], *, raw: bool = False
    ) -> list[int]:
        """The parts' tokens with ``images`` in place of the image markers, in order; the text
        between two markers is tokenized on its own (nothing merges across an image)."""
        assert self.images is not None
        pieces = split_at_markers(parts, raw=raw)
        if len(pieces) - 1 != len(images):
            raise ImageError(
                f"images: {len(images)} image(s) but the prompt has {len(pieces) - 1} image marker(s) "
                f"{rules.IMAGE_MARKER}; put one marker where each image goes, or none (then the "
                "images go in front of the text)"
            )
        toks: list[int] = []
        for k, piece in enumerate(pieces):
            if piece:
                toks.extend(self.model.tokenize_parts(piece))
            if k < len(images):
                toks.extend(self.images.tokens(images[k]))
        return toks

    def _conversation_images(self, messages: Sequence[Message]) -> list[Image]:
        """The images of a conversation's messages, in order: the last message's (this request's,
        named by their index in it) read first, then the earlier messages' again (an image of the
        history stands as the same placeholder run, so the KV holding it is reused). A message
        whose markers do not match its images is refused: a marker would take another message's
        image."""
        *history, last = messages
        images = self.read_images(last.images)
        old = [s for m in history for s in m.images]
        if not images and not old:
            return []  # markers are text
        for i, m in enumerate(history):  # the last message's markers are checked as a request's
            n = m.content.count(rules.IMAGE_MARKER)
            if n != len(m.images):
                raise ImageError(
                    f"images: message {i} ({m.role}) holds {n} image marker(s) "
                    f"{rules.IMAGE_MARKER} but {len(m.images)} image(s); in a conversation with "
                    "images each marker takes one image of its own message"
                )
        if not old:
            return images
        try:
            earlier = self.read_images(old)
        except ImageError as e:
            raise ImageError(f"an earlier message's {e}; start a new conversation (clear_kv true)") from None
        return earlier + images

    @staticmethod
    def image_tokens(tokens: Sequence[int]) -> int:
        """How many of ``tokens`` are images' (placeholders)."""
        return sum(1 for t in tokens if t < -1)

    # --- generate ---------------------------------------------------------------------
    def prepare(self, req: GenerateRequest) -> "Turn":
        """Render and tokenize a turn, and refuse it (ContextOverflowError) before anything in
        the KV changes."""
        cfg = self.config
        n_predict = req.n_predict if req.n_predict is not None else cfg.n_predict
        mask = None
        messages, turn_text, think, images, constraint = self._render_request(
            req, [] if req.clear_kv else list(self.history)
        )
        rendered = turn_text.text
        if req.tools:
            constraint = tool_grammar(self.model, self.chat, req, think, turn_text.opens_reasoning) or constraint
        if constraint is not None:
            mask = self.token_mask(constraint)
        prompt = self.tokenize_prompt(rendered, images) if images else self.tokenize_prompt(rendered)
        if not prompt:  # raw chat (no template) and no BOS: nothing to read the first logits from
            raise RequestError(
                "prompt: renders to no tokens (no chat template, and the model adds no BOS); give a non-empty prompt"
            )
        if len(prompt) + n_predict > self.n_ctx:
            of_images = f", {self.image_tokens(prompt)} of them its images'" if images else ""
            raise ContextOverflowError(
                f"prompt ({len(prompt)} tokens{of_images}) plus n_predict ({n_predict}) exceeds the context "
                f"(n_ctx {self.n_ctx})"
            )
        if req.jump_forward and req.keep_logits:
            raise RequestError("jump_forward: forced tokens have no logit row of their own; not with keep_logits")
        temperature = cfg.temperature if req.temperature is None else req.temperature
        top_p, seed = cfg.top_p if req.top_p is None else req.top_p, cfg.seed if req.seed is None else req.seed
        sampler = Sampler(temperature, top_p, seed, req.logit_bias, req.presence_penalty, req.frequency_penalty)
        pick = None  # the tool's name as a decision (tool_choice.py), after any reasoning block
        if req.tools and mask is not None and not images:
            block = name_block(self.chat, req, think, turn_text.opens_reasoning)
            special = special_markers(self.model, self.chat, think)
            pick = name_pick(self.chat, req, special, temperature, top_p, seed, block)
        return Turn(req, messages, prompt, n_predict, sampler, rendered, think, turn_text.opens_reasoning, mask, pick)

    def _render_request(
        self, req: GenerateRequest, history: list[Message]
    ) -> tuple[list[Message], Rendered, bool, list[Image], Constraint | None]:
        """The turn's messages after ``history``, its rendered prompt, whether it reasons first,
        its images and its schema/grammar constraint (a tool turn's grammar is ``prepare``'s)."""
        constraint = constraint_of(req.json_schema, req.grammar)
        # A constrained answer starts at the first token: no reasoning block before it; tool calls
        # may follow one where the template has one (runtime/tool_turn.py).
        think = (
            (self.config.think if req.think is None else req.think) and constraint is None and thinks(self.chat, req)
        )
        if req.tool_call_id is not None:  # a tool's result (docs/server.md "Tools")
            messages = history + [Message("tool", req.prompt, tool_call_id=req.tool_call_id)]
        else:
            messages = history + [Message("user", rules.place_images(req.prompt, len(req.images)), tuple(req.images))]
        images = self._conversation_images(messages) if any(m.images for m in messages) else []
        turn_text = self.chat.render_turn(
            messages, think=think, tools=req.tools, effort=req.reasoning_effort, template_vars=dict(req.template_vars)
        )
        return messages, turn_text, think, images, constraint

    def prompt_length(self, req: GenerateRequest, history: Sequence[Message]) -> int:
        """How many tokens ``req``'s prompt is after ``history``, rendered as ``prepare`` renders
        it; nothing is prefilled and the session's history is not changed."""
        _, turn_text, _, images, _ = self._render_request(req, list(history))
        return len(self.tokenize_prompt(turn_text.text, images))

    def token_mask(self, constraint: Constraint) -> TokenMask:
        """The mask that holds an answer to ``constraint`` (llguidance's vocabulary built on first use)."""
        if self._grammar_tok is None:
            self._grammar_tok = grammar_tokenizer(self.model)
        return TokenMask(self._grammar_tok, constraint, self.model.n_vocab)

    def prepare_raw(self, req: GenerateRequest, tokens: Sequence[int]) -> "Turn":
        """A turn over a raw prompt's tokens, no template, the history untouched (runtime/raw_prompt.py)."""
        return prepare_raw(self, req, tokens)

    def run(self, turn: "Turn", cancel: threading.Event) -> Generator[Step, None, GenerateResult]:
        """Yield a Step per generated token; return the GenerateResult. ``cancel`` is looked at
        before each token, and a cancelled turn is rolled back as if it never happened."""
        return (yield from self._run_turn(*turn, cancel))

    def _run_turn(
        self, req, messages, prompt, n_predict, sampler, rendered, think, opens_reasoning, mask, pick, cancel
    ) -> Generator[Step, None, GenerateResult]:
        if cancel.is_set():  # cancelled before it started: nothing is prefilled, the KV stays as it is
            now = self.stream_stats()  # nothing counted, but the cache's budget and residency are its own
            return GenerateResult(
                id=req.id,
                text="",
                reasoning="",
                tokens=(),
                cancelled=True,
                stop="cancelled",
                n_prompt=0,
                n_reused=0,
                n_past=self.kv.n_past,
                prefill_fallback="",
                prefill_s=0.0,
                decode_s=0.0,
                load_s=self.load_s,
                io=now.minus(now),
                majflt=0,
                cpu_s=0.0,
                prefill_dev_tokens=0 if self.prefill_device is not None else None,
            )
        io0, (flt0, cpu0) = self.stream_stats(), _rusage()
        plan = self.kv.align(prompt, reuse=not req.clear_kv)
        n_keep_on_cancel = plan.n_reused
        t0, dev0 = time.perf_counter(), self.live_ctx.n_dev_tokens
        logits = self.kv.append(prompt[plan.n_reused :])
        prefill_s = time.perf_counter() - t0
        prefill_dev_tokens = self.live_ctx.n_dev_tokens - dev0 if self.prefill_device is not None else None
        split, inside, marks = reasoning_split(self.chat, req, think, opens_reasoning)
        # Only the template's generation prompt can open reasoning (chat.py): a "<think>" in the
        # user's text is not the model's, and the stream only ever parses the model's output.
        stream = Detokenizer(
            split_think=split, in_reasoning=inside, markers=marks, answer_open=answer_open(self.chat, split)
        )
        shown = shown_tokens(self.model, self.chat, req, think, split)  # markup's control tokens, as text
        out: list[int] = []
        kept: list[np.ndarray] = []
        stop = "length"
        # Jump-forward: tokens the constraint forces are taken without sampling and go into the KV
        # in one batch with the token before them (``pending``: taken, not yet in the KV).
        forced: list[int] = []
        pending: list[int] = []
        t_dec, io_dec = time.perf_counter(), self.stream_stats()
        while len(out) < n_predict:
            if cancel.is_set():
                stop = "cancelled"
                break
            ts, io_s, (flt_s, cpu_s) = time.perf_counter(), self.stream_stats(), _rusage()
            ban: list[int] = []
            if pick is not None and not forced and mask is not None:  # the tool's name (tool_choice.py)
                assert logits is not None
                forced, ban = pick.before_sample(self, logits, mask)
            was_forced = bool(forced)
            tok = forced.pop(0) if forced else sampler.sample(banned(logits, mask, ban))
            sampler.taken(tok)
            # a forced token (jump-forward) was not drawn from these logits: it has no log-prob of its
            # own, but a drawn tool name's tokens have their decision's
            lp = None
            if req.top_logprobs is not None and not was_forced:
                assert logits is not None  # a sampled token was drawn from this row
                lp = token_logprobs(logits, tok, req.top_logprobs)
            elif req.top_logprobs is not None and pick is not None:
                lp = pick.logprobs(tok, req.top_logprobs)
            if req.keep_logits:
                assert logits is not None
                kept.append(logits)
            if self.model.is_eog(tok):
                stop = "eog"
                break
            out.append(tok)
            piece = self.model.token_bytes(tok, special=True) if tok in shown else self.model.token_bytes(tok)
            if pick is not None:
                pick.taken(tok, piece, not was_forced)
            d_text, d_reason = stream.push(piece)
            if mask is not None and mask.advance(tok):  # the constraint ends the answer here
                stop = "eog"
            elif len(out) < n_predict and self.kv.n_past + len(pending) >= self.n_ctx:
                stop = "ctx"
            if len(out) == n_predict or stop != "length":  # the last token: its step carries the held-back tail
                t_text, t_reason = stream.finish()
                d_text, d_reason = d_text + t_text, d_reason + t_reason
            else:
                pending.append(tok)
                if req.jump_forward and mask is not None and not forced:
                    forced = mask.forced(min(n_predict - len(out), self.n_ctx - self.kv.n_past - len(pending)))
                if not forced:
                    logits, pending = self.kv.append(pending), []
            yield self._step(
                len(out) - 1, tok, d_text, d_reason, ts, io_s, flt_s, cpu_s, kept[-1] if req.keep_logits else None, lp
            )
            if stop != "length":
                break
        # Stopped by an end-of-generation token or a cancel: what the stream still held back (a
        # possible partial marker, an incomplete character) goes out in one more step, so the
        # steps' deltas always add up to the text.
        tail_text, tail_reason = stream.finish()
        if tail_text or tail_reason:
            ts, io_s, (flt_s, cpu_s) = time.perf_counter(), self.stream_stats(), _rusage()
            yield self._step(len(out), -1, tail_text, tail_reason, ts, io_s, flt_s, cpu_s, None)
        decode_s = time.perf_counter() - t_dec
        cancelled = stop == "cancelled"
        if cancelled:
            self.kv.rollback(n_keep_on_cancel)  # the turn never happened
        elif messages is not None:
            self.history = messages + [Message("assistant", stream.text)]
        flt1, cpu1 = _rusage()
        io_end = self.stream_stats()
        return GenerateResult(
            id=req.id,
            text=stream.text,
            reasoning=stream.reasoning,
            tokens=tuple(out),
            cancelled=cancelled,
            stop=stop,
            n_prompt=len(prompt) - plan.n_reused,
            n_reused=plan.n_reused,
            n_past=self.kv.n_past,
            prefill_fallback=plan.fallback,
            prefill_s=prefill_s,
            decode_s=decode_s,
            load_s=self.load_s,
            prefill_dev_tokens=prefill_dev_tokens,
            io=io_end.minus(io0),
            decode_io=io_end.minus(io_dec),
            majflt=flt1 - flt0,
            cpu_s=cpu1 - cpu0,
            logits=tuple(kept),
            tool_decision=pick.report() if pick is not None else None,
        )

    def _step(self, i, tok, d_text, d_reason, ts, io_before, flt_before, cpu_before, logits, logprobs=None) -> Step:
        wall_ms = (time.perf_counter() - ts) * 1000.0
        now = self.stream_stats()
        io = now.minus(io_before)
        flt, cpu = _rusage()
        split = TimeSplit.of(wall_ms / 1000.0, io)  # mgmt and stall capped so that they fit the wall time
        io_ms, mgmt_ms = io.io_s * 1000.0, split.mgmt_s * 1000.0
        return Step(
            index=i,
            token=tok,
            delta_text=d_text,
            delta_reasoning=d_reason,
            wall_ms=wall_ms,
            io_ms=io_ms,
            mgmt_ms=mgmt_ms,
            stall_ms=split.stall_s * 1000.0,
            compute_ms=max(0.0, wall_ms - io_ms - mgmt_ms),
            read_mb=io.read_bytes / 1e6,
            cache_hit_pct=now.hit_pct,
            majflt=flt - flt_before,
            cpu_ms=(cpu - cpu_before) * 1000.0,
            logits=logits,
            logprobs=logprobs,
        )

    # --- scoring ----------------------------------------------------------------------
    def next_token_logprobs(self, tokens: list[int]) -> np.ndarray:
        """log-softmax of the next-token logits after ``tokens``, prefilled whole in a fresh KV."""
        if not tokens or len(tokens) > self.n_ctx:
            raise RequestError(f"tokens: need 1..{self.n_ctx} tokens, got {len(tokens)}")
        check_token_ids(tokens, self.model.n_vocab)
        self.kv.reset()
        last = self.kv.append(tokens)
        assert last is not None  # append keeps the last row by default
        return log_softmax(last)

    def perplexity(
        self, text: str | None, tokens: list[int] | None, n_window: int | None, keep_logits: bool
    ) -> PerplexityResult:
        if (text is None) == (tokens is None):
            raise RequestError("perplexity: give exactly one of text or tokens")
        ids = self.tokenize_prompt(text) if text is not None else list(tokens or [])
        if tokens is not None:
            check_token_ids(ids, self.model.n_vocab)
        # Only None means "the whole context": 0 is a value, refused by perplexity()'s n_window check
        return _perplexity(self.kv, ids, self.n_ctx if n_window is None else n_window, keep_logits=keep_logits)

    def score(self, req: ScoreRequest) -> ScoreResult:
        """Score a token list position by position on the session's KV (runtime/scoring.py)."""
        io0 = self.stream_stats()
        return dataclasses.replace(self.scorer.score(req), io=self.stream_stats().minus(io0))

    def close(self) -> None:
        if self.ctx is not None:
            self.ctx.close()
        if self.images is not None:
            self.images.close()
        if self.stream is not None:
            self.stream.close()
        self.model.close()
