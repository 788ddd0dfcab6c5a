"""How well could layer l+1's experts be guessed from layer l's output, before layer l+1 runs?

The question behind speculative prefetch (docs/benchmarks.md): split-phase reads hide only the
reads of a layer's last projection behind its own gate/up matmuls; the rest of a token's reads
can overlap compute only if they start before the layer's router has run. A cheap guess: apply
layer l+1's router (with its ffn_norm) to layer l's output ``l_out-<l>``, skipping layer l+1's
attention. This script runs the model resident through llama.cpp's C API with a ``cb_eval``
observer that copies ``l_out-*``, ``ffn_inp-*`` and ``ffn_moe_topk-*`` of each decoded token,
and reports, per layer, how many of the k experts the router picked (k = 8 on the benchmark
model) are among the guess's top k, 1.5k, 2k and 3k. As a check of the arithmetic, the same router applied to the real input
(``ffn_inp-<l+1>``) must reproduce the picked experts.

    .venv/bin/python bench/stream_predict.py [--model bench/out/synthetic-qwen3moe-16L-q4_0.gguf]

It loads the whole file (mmap, read once at load) and drops it from the page cache at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import record
from stream_child import PROMPT, NodeObserver, PlainLlama

from bmoe.stream import lookup, read_layout
from bmoe.stream.prefetch import RouterGuess

WIDTHS = (1.0, 1.5, 2.0, 3.0)  # guessed experts per layer, in multiples of n_expert_used
PREFIXES = (b"l_out-", b"ffn_inp-", b"ffn_moe_topk-")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=HERE / "out" / "synthetic-qwen3moe-16L-q4_0.gguf")
    ap.add_argument("--n-predict", type=int, default=24, help="decoded tokens measured")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="JSON results (default: next to the model)")
    record.add_args(ap)
    a = ap.parse_args(argv)

    # The guess's own arithmetic (bmoe.stream.prefetch): router rows times the norm weight,
    # without the rms factor, which scales every score alike and so never changes a ranking.
    layout = read_layout(a.model)
    router = RouterGuess.load(layout, lookup(layout.arch))
    n_used, layers, scores = layout.n_expert_used, list(layout.layers), router.scores

    obs = NodeObserver(PREFIXES, last_only=True)  # the last token's row of each
    plain = PlainLlama(a.model, extra_bufts=False, n_threads=a.threads, n_ctx=512, cb_eval=obs.c_callback)

    widths = [int(w * n_used) for w in WIDTHS]
    hits = {w: np.zeros(len(layers)) for w in widths}
    oracle_same = n = 0
    prompt = plain.tokenize(PROMPT)
    tok, pos = plain._decode(prompt, 0), len(prompt)
    for _ in range(a.n_predict):
        obs.rows.clear()
        tok = plain._decode([tok], pos)
        pos += 1
        n += 1
        for i, il in enumerate(layers[1:], start=1):
            picked = set(obs.rows[f"ffn_moe_topk-{il}"].tolist())
            oracle = set(np.argsort(-scores(il, obs.rows[f"ffn_inp-{il}"]))[:n_used].tolist())
            oracle_same += oracle == picked
            order = np.argsort(-scores(il, obs.rows[f"l_out-{layers[i - 1]}"]))
            for w in widths:
                hits[w][i] += len(picked & set(order[:w].tolist()))
    plain.close()
    fd = os.open(a.model, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)

    n_pred = n * (len(layers) - 1)
    report = {
        "model": str(a.model),
        "decoded_tokens": n,
        "layers_predicted": len(layers) - 1,
        "n_expert_used": n_used,
        "oracle_reproduces_router": oracle_same / n_pred,
        "recall": {str(w): float(hits[w].sum() / (n_pred * n_used)) for w in widths},
        "recall_by_layer": {str(w): (hits[w][1:] / (n * n_used)).round(3).tolist() for w in widths},
    }
    out = a.out or a.model.with_suffix(".predict.json")
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "recall_by_layer"}, indent=1))
    print(f"recall of the top-{n_used} guess by layer 1..{len(layers) - 1}: {report['recall_by_layer'][str(n_used)]}")
    print(f"results: {out}")
    rec = record.record(
        "stream_predict",
        command=record.invocation("stream_predict.py", argv),
        config={"model": str(a.model), "threads": a.threads, "n_predict": a.n_predict},
        tables=[
            record.figures(
                "The next layer's router on this layer's output: recall of the routed experts",
                {k: v for k, v in report.items() if k != "model"},
            )
        ],
        machine_facts=record.machine(model=a.model),
    )
    record.write(rec, a.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
