"""One configuration of bench/decide_stream.py, run in its own process (maybe inside a memory
cgroup), written as one JSON object to ``--out``.

Modes:
  probe   cold O_DIRECT reads of expert slices in random order through bmoe's ExpertReader with
          the benchmark's read lanes: the read bandwidth each decision's I/O bound divides by.
  llama   llama.cpp alone through llama_cpp's C API (mmap, no bmoe code): the kept prefix is
          prefilled once; each decision trims the KV back to it (``llama_memory_seq_rm``) and
          prefills its suffix.
  bmoe    a streamed bmoe Session answering the same decisions with ``decide``; a configuration
          the session refuses (a ConfigError) is written as ``{"refused": text}``, not a failure.

Both engines see the same text: the prefix and a suffix as one ChatML user message (bmoe with
``chat="chatml"``; llama.cpp from the same ChatML written out), and the choices are scored by
their first token at the last position. Decision 1 keeps the prefix; its figures are recorded
but the parent leaves them out of the medians.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from decide_batch import CHOICES, PREFIX, suffixes  # noqa: E402
from stream_child import PlainLlama, peak_rss_mib, proc_read_bytes  # noqa: E402

MIB = 2**20


def suffix(i: int) -> str:
    """Decision ``i``'s suffix: decide_batch's 16 screens, in turn."""
    s = suffixes()
    return s[i % len(s)]


ELEMENTS = ("button", "switch", "text field", "list item", "checkbox", "tab", "image", "link")
LABELS = (
    "Wi-Fi",
    "Bluetooth",
    "Airplane mode",
    "Mobile data",
    "Hotspot",
    "VPN",
    "Private DNS",
    "Data saver",
    "Saved networks",
    "Network preferences",
    "Add network",
    "Home network",
    "Guest",
    "Office",
    "Cafe",
)


def long_suffix(n_lines: int) -> str:
    """A screen dumped as its accessibility tree, ``n_lines`` elements (about 20 tokens each): the
    long-prompt decision of bench/plan.py, whose prefill reads (nearly) every expert once per
    ubatch, so its bytes follow the ubatch the configuration runs."""
    rows = [
        f"[{i}] {ELEMENTS[i % len(ELEMENTS)]} '{LABELS[(7 * i) % len(LABELS)]}' at ({(37 * i) % 1080}, "
        f"{(53 * i) % 2400}), {'enabled' if i % 5 else 'disabled'}."
        for i in range(n_lines)
    ]
    return " Screen (accessibility tree): " + " ".join(rows) + " A) Wi-Fi on B) Back C) Network D) Search. Letter?"


def chatml_user(text: str) -> str:
    """What bmoe's ``chat="chatml"`` renders for one user message (runtime/chat.py's template)."""
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def common_len(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def choice_logp(row: np.ndarray, first_tokens: list[int]) -> list[float]:
    """Each choice's first-token log-probability over the whole vocabulary."""
    x = row.astype(np.float64)
    m = float(np.max(x))
    lse = m + float(np.log(np.sum(np.exp(x - m))))
    return [float(x[t] - lse) for t in first_tokens]


# --- probe -----------------------------------------------------------------------------------
def run_probe(a: argparse.Namespace) -> dict[str, object]:
    """Read every expert of random layers, up to ``--probe-mib``, all queued at once: each
    projection's stacked tensor is one long run that the reader cuts into 1 MiB reads over its
    lanes. That is the fastest pattern the engine can ask for (a decision reads most experts of a
    layer, and adjacent ones are merged into one read), so the bound it gives is a lower bound."""
    from bmoe.stream import read_layout
    from bmoe.stream.reader import ALIGN, ExpertReader, ReadOp, Window

    layout = read_layout(a.model)
    layers = list(layout.layers)
    random.Random(a.seed).shuffle(layers)
    per_layer = max(layout.expert_nbytes_in_layer(il) * layout.n_expert for il in layout.layers)
    layers = layers[: max(1, min(len(layers), round(a.probe_mib * MIB / per_layer)))]
    tensors = {il: layout.layer_tensors(il) for il in layers}
    bufs = {
        p: mmap.mmap(-1, max(t.nbytes for t in layout.experts if t.proj == p) + 2 * ALIGN) for p in layout.projections
    }
    windows = {p: Window.over(b) for p, b in bufs.items()}  # page-aligned: O_DIRECT reads in place
    reader = ExpertReader(layout.files, io_threads=a.io_threads)
    t0 = time.perf_counter()
    # All at once, so the lanes never wait for the next layer to be queued (each layer's tensors
    # land in the same buffers: the bytes are thrown away, only the rate counts).
    reader.submit(
        [
            [ReadOp(t.file_index, t.offset, t.nbytes, windows[t.proj], t.offset % ALIGN)]
            for il in layers
            for t in tensors[il]
        ]
    ).wait_all()
    wall = time.perf_counter() - t0
    st = reader.stats()
    reader.close()
    return {
        "n_layers": len(layers),
        "read_bytes": st.read_bytes,
        "device_bytes": st.device_bytes,
        "wall_s": wall,
        "io_s": st.io_s,
        "bw_bytes_s": st.read_bytes / wall if wall > 0 else 0.0,
        "odirect": reader.odirect,
        "io_threads": a.io_threads,
        "peak_rss_mib": peak_rss_mib(),
    }


def rss_now() -> dict[str, float]:
    """The process's resident memory now, MiB: all of it, and its anonymous part."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "RssAnon:")):
            out["rss_mib" if line.startswith("VmRSS") else "anon_mib"] = int(line.split()[1]) / 1024
    return out


# --- llama.cpp alone ---------------------------------------------------------------------------
class MmapDecider(PlainLlama):
    """llama.cpp through its C API only, with the KV of the kept prefix reused between decisions."""

    def __init__(self, model: Path, *, n_threads: int, n_ctx: int, n_batch: int, flash_attn: bool | None) -> None:
        super().__init__(
            model, extra_bufts=False, n_threads=n_threads, n_ctx=n_ctx, n_batch=n_batch, flash_attn=flash_attn
        )
        self.kept: list[int] = []  # tokens whose KV the context holds, from position 0

    def _prefill(self, tokens: list[int], pos0: int) -> np.ndarray:
        """Prefill ``tokens`` from ``pos0``; the last one's logit row  # [n_vocab]"""
        for c in range(0, len(tokens), self.n_batch):
            chunk, b = tokens[c : c + self.n_batch], self.batch
            b.n_tokens = len(chunk)
            for i, tok in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos0 + c + i, 1
                b.seq_id[i][0] = 0
                b.logits[i] = c + i == len(tokens) - 1
            if self.lc.llama_decode(self.ctx, b) != 0:
                raise RuntimeError("llama_decode failed")
        return np.ctypeslib.as_array(self.lc.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,)).copy()

    def decide(self, tokens: list[int], n_keep: int) -> tuple[np.ndarray, int]:
        """Keep what the context holds of ``tokens[:n_keep]``, drop the rest of its KV, prefill the
        remainder; the last row and the number of tokens reused."""
        keep = min(common_len(self.kept, tokens[:n_keep]), len(tokens) - 1)
        self.lc.llama_memory_seq_rm(self.lc.llama_get_memory(self.ctx), 0, keep, -1)
        row = self._prefill(tokens[keep:], keep)
        self.kept = tokens[:n_keep]  # the KV now holds all of ``tokens``; the prefix is what the next one may reuse
        return row, keep


def run_llama(a: argparse.Namespace) -> dict[str, object]:
    r0, t0 = proc_read_bytes(), time.perf_counter()
    eng = MmapDecider(a.model, n_threads=a.threads, n_ctx=a.n_ctx, n_batch=a.ubatch, flash_attn=a.flash_attn)
    out: dict[str, object] = {
        "engine": "llama.cpp mmap",
        "load_s": time.perf_counter() - t0,
        "load_read_bytes": proc_read_bytes() - r0,
    }
    first = [eng.tokenize(c, special=False)[0] for c in CHOICES]
    alone = eng.tokenize(chatml_user(PREFIX))
    decisions = []
    for i in range(a.decisions):
        tokens = eng.tokenize(chatml_user(PREFIX + suffix(i)))
        n_keep = max(0, common_len(tokens, alone) - 1)  # as bmoe's split: one token given back
        r0, t0 = proc_read_bytes(), time.perf_counter()
        row, reused = eng.decide(tokens, n_keep)
        wall = time.perf_counter() - t0
        lp = choice_logp(row, first)
        decisions.append(
            {
                "i": i,
                "latency_s": wall,
                "n_tokens": len(tokens),
                "n_reused": reused,
                "read_bytes": proc_read_bytes() - r0,
                "best": int(np.argmax(lp)),
                "logp": lp,
                **rss_now(),
            }
        )
    out["decisions"] = decisions
    if a.decode_tokens:
        out["decode"] = llama_decode_rate(eng, a.decode_tokens)
    out["peak_rss_mib"] = peak_rss_mib()
    return out


def llama_decode_rate(eng: MmapDecider, n_predict: int) -> dict[str, object]:
    """decode_rate's greedy decode by llama.cpp alone: the same prompt from an empty KV, a mark per
    token, the rate over the marks 1..n-1 (the prefill's token and the last step left out)."""
    eng.lc.llama_memory_seq_rm(eng.lc.llama_get_memory(eng.ctx), 0, 0, -1)
    eng.kept = []
    tokens = eng.tokenize(PREFIX + suffix(0))
    row, pos, marks = eng._prefill(tokens, 0), len(tokens), [time.perf_counter()]
    for _ in range(n_predict - 1):
        row = eng._prefill([int(np.argmax(row))], pos)
        pos += 1
        marks.append(time.perf_counter())
    n = len(marks) - 2
    span = marks[-2] - marks[0] if n > 0 else 0.0
    return {"n_decode": max(0, n), "decode_s": span, "decode_tok_s": n / span if span > 0 else None}


# --- bmoe ----------------------------------------------------------------------------------------
STAT_FIELDS = (
    "read_bytes",
    "device_bytes",
    "io_s",
    "stall_s",
    "mgmt_s",
    "hits",
    "misses",
    "routed",
    "evictions",
    "n_routes",
    "guessed",
    "guess_hits",
    "wasted_bytes",
    "resident_bytes",
    "budget_bytes",
)


def open_session(a: argparse.Namespace):  # -> bmoe.session.Session
    from bmoe.config import SessionConfig
    from bmoe.session import Session

    if a.planned:  # the plan chooses what these flags leave open (docs/plan.md): nothing but the prompt's shape
        return Session(
            SessionConfig(
                model=a.model, n_ctx=a.n_ctx, chat="chatml", decide=True, flash_attn=a.flash_attn, twin_dir=a.twins
            )
        )
    # every other configuration is exactly the flags it names: no plan
    common = dict(
        model=a.model,
        n_ctx=a.n_ctx,
        n_batch=a.ubatch,
        n_ubatch=a.ubatch,
        n_threads=a.threads,
        chat="chatml",
        decide=True,
        flash_attn=a.flash_attn,
        plan="off",
    )
    if a.resident:  # the compute floor: every weight in RAM once the first decision has read it
        return Session(SessionConfig(**common))
    return Session(
        SessionConfig(
            **common,
            moe_stream=True,
            cache_mb=a.cache_mb,
            io_threads=a.io_threads,
            prefetch=a.prefetch,
            prefetch_wide_tokens=a.wide_tokens if a.prefetch else 0,
            dense_weights=a.dense_weights,
            twin_dir=a.twins,
            cache_policy=a.cache_policy,
        )
    )


def decode_rate(session, n_predict: int) -> dict[str, object]:
    """Greedy decode after the decisions: tokens per second over decodes 2..n-1 (the first decode
    after the prefill and the last step left out, as bench/stream_child.py measures)."""
    from bmoe.runtime.results import GenerateRequest

    marks: list[float] = []
    session.generate(
        GenerateRequest(prompt=PREFIX + suffix(0), n_predict=n_predict, clear_kv=True),
        on_step=lambda step: marks.append(time.perf_counter()),
    )
    n = len(marks) - 2
    span = marks[-2] - marks[0] if n > 0 else 0.0
    return {"n_decode": max(0, n), "decode_s": span, "decode_tok_s": n / span if span > 0 else None}


def run_bmoe(a: argparse.Namespace) -> dict[str, object]:
    from bmoe.decide.types import DecideRequest
    from bmoe.errors import ConfigError

    if a.cache_memory == "pages":  # this process is the child: the setting is its own
        os.environ["BMOE_CACHE_SLOTS"] = "0"
    r0, t0 = proc_read_bytes(), time.perf_counter()
    try:
        session = open_session(a)
    except ConfigError as e:
        return {"refused": str(e)}
    out: dict[str, object] = {
        "engine": "bmoe",
        "load_s": time.perf_counter() - t0,
        "load_read_bytes": proc_read_bytes() - r0,
    }
    if session.plan is not None:
        out["plan"] = session.plan.as_json()
    if session.streaming is not None:  # what the cache actually ran on (an arch may refuse slots)
        streamer = session.streaming.streamer
        out["cache_memory"] = "slots" if streamer.slots else "pages" if streamer.budget.budget_bytes > 0 else "off"
    decisions = []
    with session:
        for i in range(a.decisions):
            req = DecideRequest(id=i, prefix=PREFIX, suffix=suffix(i), choices=CHOICES)
            s0, r0 = session.stream_stats(), proc_read_bytes()
            t0 = time.perf_counter()
            r = session.decide(req)
            wall = time.perf_counter() - t0
            st = session.stream_stats().minus(s0)
            if r.error is not None:
                raise RuntimeError(f"decision {i}: {r.error}")
            decisions.append(
                {
                    "i": i,
                    "latency_s": wall,
                    "prefill_s": r.prefill_s,
                    "n_tokens": r.n_tokens,
                    "n_reused": r.n_reused,
                    "reuse": r.reuse,
                    "proc_read_bytes": proc_read_bytes() - r0,
                    "best": r.scores.best,
                    "logp": list(r.scores.choice_logp),
                    "dense_resident_frac": None if session.streaming is None else session.dense_resident_frac(),
                    **rss_now(),
                    **{k: getattr(st, k) for k in STAT_FIELDS},
                }
            )
        out["decisions"] = decisions
        if a.long_lines:  # one long-prompt decision on the kept prefix
            req = DecideRequest(id=a.decisions, prefix=PREFIX, suffix=long_suffix(a.long_lines), choices=CHOICES)
            s0, r0, t0 = session.stream_stats(), proc_read_bytes(), time.perf_counter()
            r = session.decide(req)
            wall = time.perf_counter() - t0
            if r.error is not None:
                raise RuntimeError(f"long decision: {r.error}")
            st = session.stream_stats().minus(s0)
            out["long"] = {
                "latency_s": wall,
                "prefill_s": r.prefill_s,
                "n_tokens": r.n_tokens,
                "n_reused": r.n_reused,
                "proc_read_bytes": proc_read_bytes() - r0,
                "best": r.scores.best,
                "n_ubatch": session.config.n_ubatch,
                **{k: getattr(st, k) for k in STAT_FIELDS},
            }
        if a.decode_tokens:
            out["decode"] = decode_rate(session, a.decode_tokens)
    out["peak_rss_mib"] = peak_rss_mib()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("probe", "llama", "bmoe"))
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--decisions", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--io-threads", type=int, default=8)
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--cache-mb", type=int, default=0)
    ap.add_argument("--prefetch", action="store_true")
    ap.add_argument("--wide-tokens", type=int, default=0, help="with --prefetch: --prefetch-wide-tokens (0: the rule)")
    ap.add_argument("--dense-weights", choices=("anon", "mmap"), default="anon")
    from bmoe.stream.policy import POLICIES

    ap.add_argument(
        "--cache-policy",
        choices=list(POLICIES),
        default="next-use",
        help="bmoe with --cache-mb: which experts the cache keeps",
    )
    ap.add_argument(
        "--cache-memory",
        choices=("slots", "pages"),
        default="slots",
        help="bmoe with --cache-mb: slots (the default) or page moves (BMOE_CACHE_SLOTS=0)",
    )
    ap.add_argument("--resident", action="store_true", help="bmoe: the model resident (mmap, no streaming)")
    ap.add_argument(
        "--planned", action="store_true", help="bmoe: no streaming, thread or batch flags: the plan's choice"
    )
    ap.add_argument("--flash-attn", choices=("on", "off", "auto"), default="auto")
    ap.add_argument("--twins", type=Path, default=None)
    ap.add_argument("--decode-tokens", type=int, default=0, help="also time a greedy decode this long")
    ap.add_argument("--probe-mib", type=float, default=1024)
    ap.add_argument(
        "--long-lines",
        type=int,
        default=0,
        help="bmoe: after the decisions, one decision on a screen of this many elements (long_suffix)",
    )
    ap.add_argument("--seed", type=int, default=11)
    a = ap.parse_args(argv)
    a.flash_attn = {"on": True, "off": False, "auto": None}[a.flash_attn]
    run = {"probe": run_probe, "llama": run_llama, "bmoe": run_bmoe}[a.mode]
    a.out.write_text(json.dumps(run(a), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
