"""One benchmark configuration, run in its own process (bench/stream.py starts it, maybe inside a
memory cgroup) and written as one JSON object to ``--out``.

Modes:
  llama     llama.cpp alone, driven through llama_cpp's C API with no bmoe code: mmap load
            (``--extra-bufts`` turns its repacking on, as llama.cpp's default does), prefill,
            greedy decode.
  bmoe      a bmoe Session (``--stream`` with ``--cache-mb``, or resident) through generate().
  paired    plain llama.cpp and a resident bmoe Session on the same file in one process, decoding
            in turns, so machine noise hits both alike (the "within 3%" comparison).

Decode figures leave out the first decode after the prefill (the first one-token graph) and
cover the next n_predict - 2 decodes; both engines are measured over the same steps.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

# Raw ChatML, so both engines tokenize the same text (special tokens parsed) and agree on tokens.
PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "Write a short story about a lighthouse keeper who finds a message in a bottle. Describe the "
    "weather, the sea, the keeper's small kitchen and the handwriting on the paper, then say what "
    "the message asked for and what the keeper did next.<|im_end|>\n<|im_start|>assistant\n"
)


def proc_read_bytes() -> int:
    """Bytes this process fetched from storage (page-cache hits excluded; O_DIRECT included)."""
    with open("/proc/self/io", "rb") as f:
        for line in f:
            if line.startswith(b"read_bytes:"):
                return int(line.split()[1])
    return 0


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Run:
    engine: str
    load_s: float = 0.0
    load_read_mib: float = 0.0
    n_prompt: int = 0
    prefill_s: float = 0.0
    prefill_read_mib: float = 0.0
    n_decode: int = 0  # decodes measured (n_predict - 2)
    decode_s: float = 0.0
    decode_read_mib: float = 0.0  # /proc/self/io over the measured decodes
    tokens: list[int] = field(default_factory=list)
    stream: dict[str, float] = field(default_factory=dict)  # bmoe streamed only: per decode token
    routing: dict[str, float] = field(default_factory=dict)  # bmoe streamed only
    peak_rss_mib: float = 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.n_decode / self.decode_s if self.decode_s else 0.0


# --- llama.cpp alone ---------------------------------------------------------------------------
class NodeObserver:
    """A cb_eval (``c_callback``) that asks for every node whose name starts with one of
    ``prefixes`` and copies its rows into ``rows[name]``: int32 for ``ffn_moe_topk-`` nodes, float32
    otherwise; all token rows ([n_tokens, ne0]), or with ``last_only`` the last token's ([ne0])."""

    def __init__(self, prefixes: tuple[bytes, ...], *, last_only: bool) -> None:
        import llama_cpp

        from bmoe.llama.ggml_tensor import NAME_OFFSET, GgmlTensor

        self.prefixes, self.last_only = prefixes, last_only
        self._name_at, self._tensor = NAME_OFFSET, GgmlTensor
        self.rows: dict[str, np.ndarray] = {}
        self.c_callback = llama_cpp.ggml_backend_sched_eval_callback(self._cb)

    def _cb(self, t: int | None, ask: bool, _user: object) -> bool:
        if not t:
            return False
        name = ctypes.string_at(t + self._name_at, 24)
        if not name.startswith(self.prefixes):
            return False
        if ask:
            return True
        s = self._tensor.from_address(t)
        ne0, n_tokens, nb1 = int(s.ne[0]), int(s.ne[1]), int(s.nb[1])
        ctype = ctypes.c_int32 if name.startswith(b"ffn_moe_topk-") else ctypes.c_float

        def row(j: int) -> np.ndarray:
            return np.ctypeslib.as_array((ctype * ne0).from_address(s.data + j * nb1)).copy()

        if self.last_only:
            if n_tokens:
                self.rows[s.name.decode()] = row(n_tokens - 1)
        else:
            rows = [row(j) for j in range(n_tokens)]
            self.rows[s.name.decode()] = np.stack(rows) if rows else np.zeros((0, ne0))
        return True


class PlainLlama:
    """llama.cpp through its C API only: what a user of llama.cpp gets."""

    _log_cb = None

    def __init__(
        self,
        model: Path,
        *,
        extra_bufts: bool,
        n_threads: int,
        n_ctx: int,
        n_batch: int = 512,
        flash_attn: bool | None = None,
        cb_eval: object = None,
    ) -> None:
        """``flash_attn`` None: llama.cpp's auto; ``cb_eval``: a graph callback (an observer)."""
        import llama_cpp as lc

        self.lc = lc
        if PlainLlama._log_cb is None:
            PlainLlama._log_cb = lc.llama_log_callback(lambda level, text, user: None)
            lc.llama_log_set(PlainLlama._log_cb, None)
            lc.llama_backend_init()
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.load_mode = lc.LLAMA_LOAD_MODE_MMAP
        mp.lazy_mode = lc.LLAMA_LAZY_MODE_OFF
        mp.use_extra_bufts = extra_bufts
        self.model = lc.llama_model_load_from_file(str(model).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {model}")
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self.vocab))
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, n_batch, n_batch, 1
        cp.n_threads = cp.n_threads_batch = n_threads
        if flash_attn is not None:
            cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        if cb_eval is not None:
            cp.cb_eval, cp.cb_eval_user_data = cb_eval, None
        cp.no_perf = True
        self.ctx = lc.llama_init_from_model(self.model, cp)
        self.n_batch = n_batch
        self.batch = lc.llama_batch_init(n_batch, 0, 1)

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        """Tokens of ``text``; ``special``: add BOS as the model asks and parse special tokens."""
        data = text.encode()
        buf = (self.lc.llama_token * (len(data) + 8))()
        n = self.lc.llama_tokenize(self.vocab, data, len(data), buf, len(buf), special, special)
        return list(buf[:n])

    def _decode(self, tokens: list[int], pos0: int) -> int:
        b = self.batch
        b.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos0 + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = i == len(tokens) - 1
        if self.lc.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        row = np.ctypeslib.as_array(self.lc.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,))
        return int(np.argmax(row))

    def generate(self, run: Run, prompt: list[int], n_predict: int) -> None:
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)
        r0, t0 = proc_read_bytes(), time.perf_counter()
        tok = self._decode(prompt, 0)
        run.prefill_s, run.prefill_read_mib = time.perf_counter() - t0, (proc_read_bytes() - r0) / 2**20
        run.n_prompt, out = len(prompt), [tok]
        marks: list[tuple[float, int]] = []
        while len(out) < n_predict:
            tok = self._decode([tok], len(prompt) + len(out) - 1)
            out.append(tok)
            marks.append((time.perf_counter(), proc_read_bytes()))
        run.tokens = out
        (ta, ra), (tb, rb) = marks[0], marks[-1]
        run.n_decode, run.decode_s, run.decode_read_mib = len(marks) - 1, tb - ta, (rb - ra) / 2**20

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)


def run_llama(a: argparse.Namespace) -> Run:
    run = Run(engine="llama.cpp mmap" + (" (extra bufts)" if a.extra_bufts else ""))
    r0, t0 = proc_read_bytes(), time.perf_counter()
    plain = PlainLlama(a.model, extra_bufts=a.extra_bufts, n_threads=a.threads, n_ctx=a.n_ctx)
    run.load_s, run.load_read_mib = time.perf_counter() - t0, (proc_read_bytes() - r0) / 2**20
    plain.generate(run, plain.tokenize(PROMPT), a.n_predict)
    run.peak_rss_mib = peak_rss_mib()
    return run


# --- bmoe ----------------------------------------------------------------------------------------
def open_session(a: argparse.Namespace, stream: bool):  # -> bmoe.session.Session
    from bmoe.config import SessionConfig
    from bmoe.session import Session

    cfg = SessionConfig(
        model=a.model,
        n_ctx=a.n_ctx,
        n_batch=512,
        n_ubatch=512,
        n_threads=a.threads,
        chat="none",
        moe_stream=stream,
        cache_mb=(a.cache_mb or 0) if stream else 0,
        io_threads=a.io_threads,
        twin_dir=a.twins,
        prefetch=bool(stream and a.prefetch),
    )
    return Session(cfg)


def _stream_counters(session) -> dict[str, float]:
    if session.streaming is None:
        return {}
    st, hook = session.stream_stats(), session.streaming.hook
    return {
        "read_bytes": st.read_bytes,
        "device_bytes": st.device_bytes,
        "io_s": st.io_s,
        "stall_s": st.stall_s,
        "mgmt_s": st.mgmt_s,
        "n_stop_waits": hook.n_stop_waits,
        "n_late_waits": hook.n_late_waits,
        "hits": st.hits,
        "misses": st.misses,
        "routed": st.routed,
        "evictions": st.evictions,
        "n_routes": st.n_routes,
        "resident_bytes": st.resident_bytes,
        "budget_bytes": st.budget_bytes,
        "n_calls": hook.n_calls,
        "callback_s": hook.callback_s,
        "python_s": hook.python_s,
        "guessed": st.guessed,
        "guess_hits": st.guess_hits,
        "wasted_bytes": st.wasted_bytes,
        "n_prefetches": hook.n_prefetches,
        "guess_s": hook.guess_s,
    }


def bmoe_generate(session, run: Run, n_predict: int) -> None:
    from bmoe.runtime.results import GenerateRequest

    marks: list[tuple[float, int, dict[str, float], float]] = []
    begin = (proc_read_bytes(), _stream_counters(session))

    def on_step(step) -> None:
        # Step k arrives after decode k; its own read_mb is that decode's expert bytes.
        marks.append((time.perf_counter(), proc_read_bytes(), _stream_counters(session), step.read_mb))

    res = session.generate(GenerateRequest(prompt=PROMPT, n_predict=n_predict, clear_kv=True), on_step=on_step)
    run.tokens, run.n_prompt, run.prefill_s = list(res.tokens), res.n_prompt, res.prefill_s
    (ta, ra, ca, _), (tb, rb, cb, _) = marks[0], marks[-2]
    run.n_decode, run.decode_s, run.decode_read_mib = len(marks) - 2, tb - ta, (rb - ra) / 2**20
    if ca:
        n = run.n_decode
        run.stream = {k: (cb[k] - ca[k]) / n for k in ca if k not in ("resident_bytes", "budget_bytes")}
        run.stream["resident_mib"] = cb["resident_bytes"] / 2**20
        run.stream["budget_mib"] = cb["budget_bytes"] / 2**20
        # Prefill's expert bytes: up to step 0, less decode 0's own share.
        run.prefill_read_mib = (ca["read_bytes"] - begin[1]["read_bytes"] - marks[0][3] * 1e6) / 2**20
    else:
        run.prefill_read_mib = (ra - begin[0]) / 2**20


def spy_routes(session) -> list[tuple[int, frozenset[int]]]:
    """Record each one-token route's (layer, experts): the check that routing varies."""
    streamer, routes = session.streaming.streamer, []
    inner = streamer.on_route

    def on_route(il: int, ids: np.ndarray) -> None:
        if ids.shape[0] == 1:
            routes.append((il, frozenset(int(e) for e in ids[0])))
        inner(il, ids)

    streamer.on_route = on_route
    return routes


def routing_summary(routes: list[tuple[int, frozenset[int]]], n_layers: int) -> dict[str, float]:
    """Distinct (layer, expert) pairs over the decode, and how much a token's set overlaps the previous one's."""
    tokens = [routes[i : i + n_layers] for i in range(0, len(routes) - n_layers + 1, n_layers)]
    sets = [frozenset((il, e) for il, es in tok for e in es) for tok in tokens]
    overlaps = [len(a & b) / len(b) for a, b in itertools.pairwise(sets) if b]
    return {
        "n_tokens": len(sets),
        "pairs_per_token": float(np.mean([len(s) for s in sets])) if sets else 0.0,
        "distinct_pairs": len(frozenset().union(*sets)) if sets else 0,
        "overlap_with_previous": float(np.mean(overlaps)) if overlaps else 0.0,
    }


def run_bmoe(a: argparse.Namespace) -> Run:
    stream = a.cache_mb is not None
    run = Run(
        engine="bmoe "
        + (f"streamed, cache {a.cache_mb} MiB" + (", prefetch" if a.prefetch else "") if stream else "resident")
    )
    r0, t0 = proc_read_bytes(), time.perf_counter()
    session = open_session(a, stream)
    run.load_s, run.load_read_mib = time.perf_counter() - t0, (proc_read_bytes() - r0) / 2**20
    routes = spy_routes(session) if stream else []
    bmoe_generate(session, run, a.n_predict)
    if stream:
        run.routing = routing_summary(routes, len(session.streaming.layout.layers))
    run.peak_rss_mib = peak_rss_mib()
    session.close()
    return run


def run_paired(a: argparse.Namespace) -> dict[str, object]:
    """Plain llama.cpp and resident bmoe loaded side by side, decoding in turns."""
    plain = PlainLlama(a.model, extra_bufts=False, n_threads=a.threads, n_ctx=a.n_ctx)
    sessions = {"bmoe": open_session(a, stream=False)}
    if a.cache_mb:
        # Streamed with a cache that holds every expert: once warm nothing is read, so its gap to
        # resident bmoe is what streaming costs besides I/O (callbacks, bookkeeping, graph splits).
        sessions["cached"] = open_session(a, stream=True)
    prompt = plain.tokenize(PROMPT)
    plain.generate(Run("warm-up"), prompt, 4)  # first graphs and the page cache, every side
    for s in sessions.values():
        for _ in range(2 if s.streaming is not None else 1):  # the cache: prefill routes nearly every expert
            bmoe_generate(s, Run("warm-up"), a.n_predict)
    rounds: list[dict[str, object]] = []
    for _ in range(a.repeats):
        p = Run("llama.cpp mmap (plain)")
        plain.generate(p, prompt, a.n_predict)
        rnd = {"plain": asdict(p) | {"decode_tok_s": p.decode_tok_s}}
        for key, s in sessions.items():
            b = Run(key)
            bmoe_generate(s, b, a.n_predict)
            rnd[key] = asdict(b) | {"decode_tok_s": b.decode_tok_s}
        rounds.append(rnd)
    for s in sessions.values():
        s.close()
    plain.close()
    return {"rounds": rounds, "peak_rss_mib": peak_rss_mib()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("llama", "bmoe", "paired"))
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--extra-bufts", action="store_true")
    ap.add_argument("--cache-mb", type=int, default=None, help="streamed with this budget (0 = off)")
    ap.add_argument("--io-threads", type=int, default=8)
    ap.add_argument("--prefetch", action="store_true", help="streamed with speculative prefetch (cache off)")
    ap.add_argument("--twins", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    if a.n_predict < 3:
        ap.error("--n-predict must be at least 3 (the first decode is left out)")
    if a.mode == "paired":
        result: dict[str, object] = run_paired(a)
    else:
        run = run_llama(a) if a.mode == "llama" else run_bmoe(a)
        result = asdict(run) | {"decode_tok_s": run.decode_tok_s}
    a.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
