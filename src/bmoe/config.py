"""SessionConfig: every session setting and its rule, validated in one place.

The CLI maps flags onto these fields one to one (docs/cli.md lists both names).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .errors import ConfigError

ChatMode = Literal["template", "chatml", "none"]
PrefixCacheMode = Literal["auto", "on", "off"]


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
    # expert streaming (docs/streaming.md)
    moe_stream: bool = False
    cache_mb: int | Literal["auto"] = 0
    cache_ceil_mb: int = 0  # 0: no ceiling for --cache-mb auto
    cache_force: bool = False
    odirect: bool = True
    io_threads: int = 4
    stream_cache_dir: Path | None = None  # where dense twins live (None: $BMOE_CACHE_DIR or ~/.cache/bmoe)
    stream_read_all: bool = False  # verification: read every expert at every route (gate G3)
    prefetch: bool = False  # speculative prefetch of the next layer's guessed experts (cache off only)
    # decide (docs/decide.md)
    decide: bool = False
    decide_prefix_cache: PrefixCacheMode = "auto"
    # prefill device (docs/prefill-device.md): None = everything on the CPU
    prefill_device: str | None = None
    prefill_min_tokens: int = 32  # ubatches at least this wide run on the device

    def __post_init__(self) -> None:
        validate(self)

    @property
    def threads(self) -> int:
        return self.n_threads or (os.cpu_count() or 1)


def _int_at_least(cfg: SessionConfig, name: str, lo: int) -> None:
    v = getattr(cfg, name)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"{name}: must be an integer >= {lo}, got {v!r}")


def validate(cfg: SessionConfig) -> None:
    """Raise ConfigError naming the first invalid field."""
    if not isinstance(cfg.model, (str, Path)) or str(cfg.model) == "":
        raise ConfigError(f"model: must be a path to a .gguf file, got {cfg.model!r}")
    if not Path(cfg.model).is_file():
        raise ConfigError(f"model: file not found: {cfg.model}")
    _int_at_least(cfg, "n_ctx", 16)
    _int_at_least(cfg, "n_batch", 1)
    _int_at_least(cfg, "n_ubatch", 1)
    if cfg.n_ubatch > cfg.n_batch:
        raise ConfigError(f"n_ubatch: must be <= n_batch ({cfg.n_batch}), got {cfg.n_ubatch}")
    _int_at_least(cfg, "n_threads", 0)
    _int_at_least(cfg, "n_predict", 1)
    if isinstance(cfg.temperature, bool) or not isinstance(cfg.temperature, (int, float)) or not 0.0 <= cfg.temperature <= 10.0:
        raise ConfigError(f"temperature: must be a number in [0, 10], got {cfg.temperature!r}")
    if isinstance(cfg.top_p, bool) or not isinstance(cfg.top_p, (int, float)) or not 0.0 < cfg.top_p <= 1.0:
        raise ConfigError(f"top_p: must be a number in (0, 1], got {cfg.top_p!r}")
    if cfg.seed is not None and (isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or cfg.seed < 0):
        raise ConfigError(f"seed: must be a non-negative integer, got {cfg.seed!r}")
    if cfg.chat not in ("template", "chatml", "none"):
        raise ConfigError(f"chat: must be one of template, chatml, none, got {cfg.chat!r}")
    for name in ("think", "kv_f32", "moe_stream", "cache_force", "odirect", "decide", "stream_read_all", "prefetch"):
        if not isinstance(getattr(cfg, name), bool):
            raise ConfigError(f"{name}: must be true or false, got {getattr(cfg, name)!r}")
    if cfg.flash_attn is not None and not isinstance(cfg.flash_attn, bool):
        raise ConfigError(f"flash_attn: must be true, false or unset, got {cfg.flash_attn!r}")
    if cfg.cache_mb != "auto":
        _int_at_least(cfg, "cache_mb", 0)
    _int_at_least(cfg, "cache_ceil_mb", 0)
    _int_at_least(cfg, "io_threads", 1)
    if cfg.stream_cache_dir is not None and not isinstance(cfg.stream_cache_dir, (str, Path)):
        raise ConfigError(f"stream_cache_dir: must be a folder path, got {cfg.stream_cache_dir!r}")
    if cfg.decide_prefix_cache not in ("auto", "on", "off"):
        raise ConfigError(f"decide_prefix_cache: must be one of auto, on, off, got {cfg.decide_prefix_cache!r}")
    if cfg.prefill_device is not None and (not isinstance(cfg.prefill_device, str) or not cfg.prefill_device):
        raise ConfigError(f"prefill_device: must be a device name (bmoe-cli --list-devices), got {cfg.prefill_device!r}")
    if cfg.prefetch:
        why = ("it needs --moe-stream" if not cfg.moe_stream
               else "it reads into the shared buffers of the cache-off mode, so it needs --cache-mb 0" if cfg.cache_mb != 0
               else "a prefill device copies weights before the hook could wait for a guessed read" if cfg.prefill_device
               else None)
        if why:
            raise ConfigError(f"prefetch: cannot be on here: {why}")
    # 2 at least: a one-token ubatch is decode, which stays on the CPU
    _int_at_least(cfg, "prefill_min_tokens", 2)

