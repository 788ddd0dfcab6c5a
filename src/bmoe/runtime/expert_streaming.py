"""Composes expert streaming for a session: layout, streamer, llama hook, dense twin.

Everything here happens before the model loads, because what llama.cpp opens depends on it:
a streamed session loads the *dense twin* (a sparse copy of the GGUF whose expert ranges
are holes), so opening reads only the dense weights; the experts come from the original
file through the streamer. docs/streaming.md explains why lazy_mode cannot do this.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bmoe.config import SessionConfig
from bmoe.errors import BmoeError, ConfigError, ModelFileError
from bmoe.llama.dense_anon import AnonDense
from bmoe.llama.expert_hook import ExpertHook
from bmoe.llama.ggml_tensor import GgmlLayoutError
from bmoe.llama.mremap_mover import LibcPageMover
from bmoe.llama.residency import PageResidency
from bmoe.stream import (
    ArchEntry,
    Budget,
    CacheBudgetError,
    LayoutError,
    ModelLayout,
    NothingToStreamError,
    Streamer,
    StreamSettings,
    TwinError,
    UnsupportedArchError,
    lookup,
    read_layout,
    resolve_budget,
)
from bmoe.stream.content import ContentSample
from bmoe.stream.prefetch import PrefetchError, RouterGuess
from bmoe.stream.reader import StreamIOError, stderr_warn
from bmoe.stream.stats import StreamStats
from bmoe.stream.twin import default_twin_dir, dense_ranges, open_twin


class StreamSetupError(BmoeError):
    """Streaming cannot be set up for this model or these settings (refused at startup)."""


class StreamConfigError(StreamSetupError, ConfigError):
    """... because of a setting: a cache budget under the floor, --prefetch where it cannot work."""


class StreamModelError(StreamSetupError, ModelFileError):
    """... because of the model file: a layout or architecture bmoe cannot stream, a damaged GGUF."""


@dataclass
class ExpertStreaming:
    """The live streaming parts a session holds, behind the few calls the session makes."""

    streamer: Streamer
    hook: ExpertHook
    load_path: Path  # what llama.cpp opens: the dense twin, or the original if no twin could be made
    # Each file llama.cpp maps with its dense (non-expert) byte ranges.
    dense_files: tuple[tuple[Path, tuple[tuple[int, int], ...]], ...]
    # Each file llama.cpp maps with its expert byte ranges: nothing reads them there (the hook
    # rebinds the expert tensors), so the pages its load populated are given back.
    expert_files: tuple[tuple[Path, tuple[tuple[int, int], ...]], ...]
    # --dense-weights: "anon" moves those ranges into anonymous memory once the model is loaded
    # (llama/dense_anon.py); "mmap" leaves them mapped from the file.
    dense_weights: str
    # Where the dense pages are measured: the files' page cache (mmap), or the anonymous pages
    # (anon, set by ``attach``; None until then).
    dense: PageResidency | AnonDense | None = None
    _dense_frac: tuple[float, float] = field(default=(-1e9, 0.0))  # (when, value) of the last sample

    @property
    def layout(self) -> ModelLayout:
        """Where every expert lives in the user's GGUF (what the streamer reads)."""
        return self.streamer.layout

    def stats(self) -> StreamStats:
        # io_s is how long reads were in flight; stall_s the part of it the graph waited for
        # (the rest overlapped compute: split-phase reads, docs/streaming.md).
        return self.streamer.stats()

    @property
    def anon_ranges(self) -> tuple[tuple[Path, tuple[tuple[int, int], ...]], ...]:
        """What the model load moves into anonymous memory (ModelLoadParams.anon_ranges)."""
        return self.dense_files if self.dense_weights == "anon" else ()

    def attach(self, anon: AnonDense | None) -> None:
        """The model is loaded: with anon, its anonymous dense pages are what is measured."""
        if self.dense_weights == "anon":
            if anon is None:
                raise ValueError("dense_weights anon, but the model load moved nothing into anonymous memory")
            self.dense = anon

    @property
    def dense_anon_bytes(self) -> int:
        """Bytes of dense weights held in anonymous memory (whole pages); 0 with mmap."""
        return self.dense.nbytes if isinstance(self.dense, AnonDense) else 0

    def dense_resident_frac(self) -> float:
        # mincore walks every page (about 60 ns each here): sample at most once a second, since
        # residency moves slowly and a per-token walk of a large model's dense part would cost ms.
        when, value = self._dense_frac
        now = time.monotonic()
        if now - when >= 1.0 and self.dense is not None:
            value = self.dense.fraction()
            self._dense_frac = (now, value)
        return value

    def close(self) -> None:
        if self.dense is not None:
            self.dense.close()
        self.streamer.close()


def stream_overlap(config: SessionConfig) -> bool:
    """Whether reads may overlap the expert matmuls of their layer (split phase).

    Not with a prefill device: an offloaded matmul reads a copy of its weights that the scheduler
    takes when the device's graph split starts, before any node of it is asked about, so a
    projection still being read could be copied half done. ``BMOE_STREAM_OVERLAP=0`` turns it off
    (every route then waits for all its reads, as before), for debugging and comparisons."""
    return config.prefill_device is None and os.environ.get("BMOE_STREAM_OVERLAP", "1") != "0"


def stream_slots(config: SessionConfig) -> bool:
    """Whether the cache may keep its experts in slots (SlotCache) rather than move pages.

    Not with a prefill device: the slots renumber the routed ids in place, and a device computes
    them in its own memory. ``BMOE_CACHE_SLOTS=0`` turns slots off (page moves, as before), for
    comparisons; an arch that gathers other tensors by the ids (cache.slots_refusal) keeps page
    moves anyway."""
    return config.prefill_device is None and os.environ.get("BMOE_CACHE_SLOTS", "1") != "0"


def stream_settings(config: SessionConfig) -> StreamSettings:
    """The streamer's settings of a (checked) config."""
    return StreamSettings(
        cache_mb=config.cache_mb,
        cache_ceil_mb=config.cache_ceil_mb or None,
        cache_force=config.cache_force,
        policy=config.cache_policy,
        odirect=config.odirect,
        io_threads=config.io_threads,
        read_all=config.stream_read_all,
    )


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """What ``check_streaming`` read and decided: the parts ``open_streaming`` builds on."""

    layout: ModelLayout
    entry: ArchEntry
    settings: StreamSettings
    budget: Budget
    guess: RouterGuess | None


_SETUP_ERRORS = (
    LayoutError,
    NothingToStreamError,
    UnsupportedArchError,
    CacheBudgetError,
    PrefetchError,
    OSError,
    StreamIOError,
)  # StreamIOError: a shard changed before the reader opened it


def check_streaming(config: SessionConfig) -> StreamPlan:
    """Every refusal of a --moe-stream open that needs no memory: the file's layout (a truncated or
    malformed GGUF is refused here, naming it, before a dense twin of it is written), the
    architecture, the cache budget against the floor, read-ahead's router. ``--plan-only`` runs it
    too (``check_opening``), so it refuses what opening refuses, with the same line."""
    try:
        layout = read_layout(config.model)
        if config.n_expert_used is not None:  # what llama.cpp will route (checked at open: runtime.py)
            layout = layout.with_n_expert_used(config.n_expert_used)
        entry = lookup(layout.arch)
        settings = stream_settings(config)
        budget = resolve_budget(settings, layout, warn=stderr_warn)
        guess = RouterGuess.load(layout, entry, wide=config.prefetch_wide_tokens or None) if config.prefetch else None
    except _SETUP_ERRORS as e:
        raise _setup_error(config, e) from e
    return StreamPlan(layout, entry, settings, budget, guess)


def open_streaming(config: SessionConfig) -> ExpertStreaming:
    checked = check_streaming(config)
    layout, entry, settings, guess = checked.layout, checked.entry, checked.settings, checked.guess
    try:
        # The content sample of the file as it is now: the twin must have been made from the same
        # bytes, and the reader compares it again on a schedule (an overwrite in place that kept
        # size, mtime and inode becomes the sticky FileChangedError).
        content = ContentSample.take(layout)
        pages = LibcPageMover.available(sum(t.n_expert for t in layout.experts))
        # Read-ahead two layers deep needs the next layer's buffers apart from this one's: with the
        # cache off that is a second set of shared buffers (one layer of expert bytes more).
        streamer = Streamer(
            layout,
            settings,
            budget=checked.budget,
            pages=pages,
            buffer_sets=2 if guess else 1,
            slots=stream_slots(config),
        )
    except _SETUP_ERRORS as e:
        raise _setup_error(config, e) from e
    try:
        hook = ExpertHook(streamer, entry, overlap=stream_overlap(config), guess=guess)
    except GgmlLayoutError as e:
        streamer.close()
        raise _setup_error(config, e) from e
    try:
        try:
            load_path = open_twin(layout, config.twin_dir or default_twin_dir(), content).path
        except TwinError as e:
            print(f"bmoe: {e}; loading the original file (its experts will be read once at load)", file=sys.stderr)
            load_path = Path(config.model)
        try:
            streamer.reader.watch_content(content)
        except StreamIOError as e:  # the file changed while it was being opened
            raise _setup_error(config, e) from e
        # The twin's shards carry the original names, so shard i of what llama.cpp maps is easy to find.
        shards = [load_path.parent / f.path.name for f in layout.files]
        dense_files = tuple((shards[i], tuple(dense_ranges(layout, i))) for i in range(len(layout.files)))
        expert_files = tuple(
            (shards[i], tuple((t.offset, t.offset + t.nbytes) for t in layout.experts if t.file_index == i))
            for i in range(len(layout.files))
        )
        mode = "anon" if config.dense_anon else "mmap"
        dense = PageResidency([(p, list(r)) for p, r in dense_files]) if mode == "mmap" else None
    except BaseException:
        streamer.close()
        raise
    return ExpertStreaming(
        streamer=streamer,
        hook=hook,
        load_path=load_path,
        dense_files=dense_files,
        expert_files=expert_files,
        dense_weights=mode,
        dense=dense,
    )


def _setup_error(config: SessionConfig, e: BaseException) -> StreamSetupError:
    """``--moe-stream: <why>``, naming the user's model file unless ``why`` already does; a
    ConfigError for a setting's fault, a ModelFileError for the file's (the ggml check's refusal,
    a mismatch with the llama.cpp build, is neither)."""
    why, model = str(e), str(config.model)
    kind = (
        StreamConfigError
        if isinstance(e, ConfigError)
        else StreamModelError
        if isinstance(e, (ModelFileError, OSError, StreamIOError))
        else StreamSetupError
    )
    return kind(f"--moe-stream: {why}" if model in why else f"--moe-stream: {model}: {why}")
