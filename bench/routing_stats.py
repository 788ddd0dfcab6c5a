"""Routing statistics of a recorded route trace and of a synthetic model's greedy decode, side by side.

    .venv/bin/python bench/routing_stats.py --trace /work/shared/data/route-traces/qwen3-30b-a3b-q4_k_m.route.csv \\
        --preset uniform trace [--model X.gguf] [--k 6 8] [--n-predict 128] [--write-trace DIR] [--json]

Why: bench/synthetic_moe.py's presets are meant to route like a real model, so that cache
benchmarks on them say something about real workloads. This tool measures how close they land.

Statistics, over the decode phase only, per MoE layer, then the mean over layers:

- ``distinct``: experts the run touched in the layer (of n_expert);
- ``hot8``: the share of the layer's activations (tokens x k) that its 8 most used experts carry;
- ``lag1`` / ``lag2`` / ``lag8`` / ``lag32``: the share of a token's k experts that the token
  ``lag`` steps earlier also used (lag1 is the previous-token predictor's accuracy);
- ``layer0_distinct`` / ``layer0_hot8``: the first MoE layer alone (real models route it
  near-uniformly).

A synthetic model is loaded resident through llama.cpp's C API (as bench/stream_predict.py does)
with a ``cb_eval`` observer that copies each layer's router probabilities (``ffn_moe_probs-<l>``)
for the prompt (bench/stream_child.py's PROMPT) and ``--n-predict`` greedy decode tokens. Its
routes at top-k are the k most probable experts, so one run gives the engine's top-8 and the
top-6 that the Qwen3 trace was recorded at (``--n-expert-used 6``: the same router, fewer slots);
the top-8 set is checked against llama.cpp's own ``ffn_moe_topk``. ``--write-trace DIR`` writes
each model's run as a ``route_trace v1`` CSV (top n_expert_used) that bench/cache_replay.py replays.

``--json`` adds a last line ``{"<source>": {"summary": {..}, "per_layer": {..}}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

LAGS = (1, 2, 8, 32)
HOT = 8
SUMMARY_KEYS = ("distinct", "hot8", *(f"lag{g}" for g in LAGS), "layer0_distinct", "layer0_hot8")


# --- statistics ----------------------------------------------------------------------------------
def layer_stats(routes: np.ndarray, n_expert: int) -> dict[str, list[float]]:
    """Per-layer statistics of decode routes  # routes: [tokens, layers, k] expert ids"""
    n_tok, n_layer, k = routes.shape
    out: dict[str, list[float]] = defaultdict(list)
    for il in range(n_layer):
        r = routes[:, il, :]
        counts = np.bincount(r.ravel(), minlength=n_expert)
        out["distinct"].append(float(np.count_nonzero(counts)))
        out["hot8"].append(float(np.sort(counts)[-HOT:].sum() / r.size))
        member = np.zeros((n_tok, n_expert), dtype=bool)
        member[np.arange(n_tok)[:, None], r] = True
        for lag in LAGS:
            shared = (member[lag:] & member[:-lag]).sum(axis=1) if lag < n_tok else np.zeros(0)
            out[f"lag{lag}"].append(float(shared.mean() / k) if shared.size else float("nan"))
    return dict(out)


def summarize(per_layer: dict[str, list[float]]) -> dict[str, float]:
    s = {key: float(np.mean(v)) for key, v in per_layer.items()}
    s["layer0_distinct"] = per_layer["distinct"][0]
    s["layer0_hot8"] = per_layer["hot8"][0]
    return s


def top_k(probs: np.ndarray, k: int) -> np.ndarray:
    """The k most probable experts, most probable first (ties: lower id)  # [.., E] -> [.., k]"""
    return np.argsort(-probs, axis=-1, kind="stable")[..., :k]


# --- route trace CSV -----------------------------------------------------------------------------
def read_decode_routes(path: Path, tokens: int | None = None) -> tuple[np.ndarray, int]:
    """Decode routes of turn 0 of a route_trace v1 CSV, slots in order, and n_expert."""
    n_expert = 0
    cells: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                for part in line.split():
                    if part.startswith("n_expert="):
                        n_expert = int(part.split("=")[1])
                continue
            if line.startswith("turn,") or not line.strip():
                continue
            turn, phase, step, layer, slot, expert = (int(x) for x in line.split(",")[:6])
            if turn == 0 and phase == 1:
                cells[(step, layer)].append((slot, expert))
    steps = sorted({s for s, _ in cells})[:tokens]
    layers = sorted({il for _, il in cells})
    routes = np.array([[[e for _, e in sorted(cells[(s, il)])] for il in layers] for s in steps])
    return routes, n_expert


@dataclass
class ModelRun:
    """Router probabilities of one greedy run: prompt rows and decode rows."""

    model: Path
    layers: list[int]
    n_expert_used: int
    prefill_probs: np.ndarray  # [prompt tokens, layers, E]
    decode_probs: np.ndarray  # [decode tokens, layers, E]
    tokens: list[int]  # decoded token ids
    topk_agrees: float  # share of (token, layer) whose top-n_expert_used set is llama.cpp's


def write_route_trace(run: ModelRun, path: Path) -> None:
    """The run as a route_trace v1 CSV at top n_expert_used (weights: the renormalised probs). The
    prefill routes every prompt token at every layer but the last, which routes the last token only,
    as llama.cpp does when only the last row's logits are kept (the run itself kept every row)."""
    import gguf

    reader = gguf.GGUFReader(run.model)
    exp_bytes: dict[int, int] = defaultdict(int)
    dense_bytes: dict[int, int] = defaultdict(int)
    n_expert = run.decode_probs.shape[-1]
    for t in reader.tensors:
        if t.name.startswith("blk."):
            il = int(t.name.split(".")[1])
            if "_exps" in t.name:
                exp_bytes[il] += int(t.n_bytes) // n_expert
            else:
                dense_bytes[il] += int(t.n_bytes)
    k = run.n_expert_used
    with open(path, "w") as f:
        f.write("# route_trace v1\n")
        f.write(
            f"# model={run.model.name} arch=qwen3moe n_layer={len(run.layers)} n_expert={n_expert} n_expert_used={k}\n"
        )
        for il in run.layers:
            f.write(f"# layer={il} expert_bytes={exp_bytes[il]} dense_bytes={dense_bytes[il]}\n")
        f.write("turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n")
        for phase, probs in ((0, run.prefill_probs), (1, run.decode_probs)):
            picked = top_k(probs, k)
            for step in range(probs.shape[0]):
                for i, il in enumerate(run.layers):
                    if phase == 0 and il == run.layers[-1] and step != probs.shape[0] - 1:
                        # llama.cpp's last layer computes only the rows whose output is kept: in
                        # a prompt's prefill, its last token (as in the recorded traces)
                        continue
                    w = probs[step, i, picked[step, i]]
                    w = w / w.sum()
                    for slot in range(k):
                        f.write(
                            f"0,{phase},{step},{il},{slot},{picked[step, i, slot]},{w[slot]:.6f},0,{exp_bytes[il]}\n"
                        )


# --- a synthetic model's run ---------------------------------------------------------------------
def _prefill_all_rows(plain, prompt: list[int]) -> int:
    """The prompt in one batch with every row's output kept: llama.cpp computes the last layer's
    FFN only for output rows, so the last layer's routes of every prompt token need them all."""
    b = plain.batch
    b.n_tokens = len(prompt)
    for i, tok in enumerate(prompt):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, i, 1, True
        b.seq_id[i][0] = 0
    if plain.lc.llama_decode(plain.ctx, b) != 0:
        raise RuntimeError("llama_decode failed")
    row = np.ctypeslib.as_array(plain.lc.llama_get_logits_ith(plain.ctx, -1), shape=(plain.n_vocab,))
    return int(np.argmax(row))


def run_model(model: Path, n_predict: int, threads: int) -> ModelRun:
    from stream_child import PROMPT, NodeObserver, PlainLlama

    from bmoe.stream import read_layout

    layout = read_layout(model)
    layers, k = list(layout.layers), layout.n_expert_used
    obs = NodeObserver((b"ffn_moe_probs-", b"ffn_moe_topk-"), last_only=False)  # every token row
    plain = PlainLlama(model, extra_bufts=False, n_threads=threads, n_ctx=1024, cb_eval=obs.c_callback)

    def take() -> tuple[np.ndarray, int]:
        probs = np.stack([obs.rows[f"ffn_moe_probs-{il}"] for il in layers], axis=1)  # [T, L, E]
        picked = np.stack([obs.rows[f"ffn_moe_topk-{il}"] for il in layers], axis=1)  # [T, L, k]
        mine = np.sort(top_k(probs, k), axis=-1)
        return probs, int((mine == np.sort(picked, axis=-1)).all(axis=-1).sum())

    try:
        prompt = plain.tokenize(PROMPT)
        obs.rows.clear()
        tok = _prefill_all_rows(plain, prompt)
        prefill, agree = take()
        decode, tokens, pos = [], [], len(prompt)
        for _ in range(n_predict):
            obs.rows.clear()
            tokens.append(tok)
            tok = plain._decode([tok], pos)
            pos += 1
            probs, a = take()
            decode.append(probs[0])
            agree += a
    finally:
        plain.close()
        fd = os.open(model, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    cells = (prefill.shape[0] + n_predict) * len(layers)
    return ModelRun(model, layers, k, prefill, np.stack(decode), tokens, agree / cells)


# --- report --------------------------------------------------------------------------------------
def table(sources: dict[str, dict[str, float]]) -> str:
    names = list(sources)
    lines = ["| statistic | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for key in SUMMARY_KEYS:
        cells = []
        for n in names:
            v = sources[n].get(key, float("nan"))
            cells.append(f"{v:.1f}" if "distinct" in key else f"{100 * v:.1f}%")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, nargs="*", default=[], help="route_trace v1 CSVs")
    ap.add_argument("--tokens", type=int, default=None, help="first N decode tokens of each trace")
    ap.add_argument("--preset", nargs="*", default=[], help="synthetic presets (written under --work if missing)")
    ap.add_argument("--work", type=Path, default=HERE / "out")
    ap.add_argument("--model", type=Path, nargs="*", default=[], help="other synthetic GGUFs")
    ap.add_argument("--k", type=int, nargs="+", default=[6, 8], help="top-k at which a model's routes are counted")
    ap.add_argument("--n-predict", type=int, default=128, help="greedy decode tokens (the Qwen3 trace has 128)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write-trace", type=Path, default=None, help="directory for each model's route CSV")
    ap.add_argument("--json", action="store_true")
    import record

    record.add_args(ap)
    a = ap.parse_args(argv)

    summaries: dict[str, dict[str, float]] = {}
    report: dict[str, dict] = {}
    for path in a.trace:
        routes, n_expert = read_decode_routes(path, a.tokens)
        per = layer_stats(routes, n_expert)
        name = f"{path.name.split('.')[0]} top{routes.shape[2]}"
        summaries[name] = summarize(per)
        report[name] = {"summary": summaries[name], "per_layer": per, "decode_tokens": int(routes.shape[0])}
    models = list(a.model)
    if a.preset:
        from synthetic_moe import preset_path

        models += [preset_path(a.work, p) for p in a.preset]
    for model in models:
        run = run_model(model, a.n_predict, a.threads)
        label = model.name.removeprefix("synthetic-qwen3moe-").removesuffix("-q4_0.gguf")
        print(
            f"{label}: {len(set(run.tokens))} distinct of {len(run.tokens)} decoded tokens; "
            f"top-{run.n_expert_used} set equal to llama.cpp's ffn_moe_topk in {100 * run.topk_agrees:.1f}% "
            f"of (token, layer)",
            file=sys.stderr,
        )
        for k in a.k:
            per = layer_stats(top_k(run.decode_probs, k), run.decode_probs.shape[-1])
            name = f"{label} top{k}"
            summaries[name] = summarize(per)
            report[name] = {
                "summary": summaries[name],
                "per_layer": per,
                "decode_tokens": len(run.tokens),
                "distinct_tokens": len(set(run.tokens)),
                "topk_agrees": run.topk_agrees,
            }
        if a.write_trace:
            a.write_trace.mkdir(parents=True, exist_ok=True)
            out = a.write_trace / f"{model.stem}.route.csv"
            write_route_trace(run, out)
            print(f"route trace: {out}", file=sys.stderr)
    print(table(summaries))
    if a.json:
        print(json.dumps(report))
    names = list(summaries)
    rows = [
        {"name": key, **{n: summaries[n].get(key, 0.0) * (1 if "distinct" in key else 100) for n in names}}
        for key in SUMMARY_KEYS
    ]
    rec = record.record(
        "routing_stats",
        command=record.invocation("routing_stats.py", argv),
        config={"n_predict": a.n_predict, "k": a.k, "presets": a.preset, "traces": [p.name for p in a.trace]},
        tables=[
            record.table(
                "Decode routing, mean over layers (distinct: of the layer's experts; the rest in %)",
                [("name", "statistic", "")] + [(n, n, ".1f") for n in names],
                rows,
            )
        ],
        partial=set(a.preset) != {"uniform", "trace"},
    )
    record.write(rec, a.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
