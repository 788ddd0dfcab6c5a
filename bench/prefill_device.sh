#!/usr/bin/env bash
# Prefill device: the G18g checks with a tolerance, and prefill timed with and without the device.
#
#   bench/prefill_device.sh                       first GPU llama-cpp-python provides; none: says so, exits 0
#   bench/prefill_device.sh --device CUDA0 --model Qwen3-30B-A3B-Q4_K_M.gguf --moe-stream
#   bench/prefill_device.sh --rpc                 the CI stand-in (RPC over 127.0.0.1, needs -DGGML_RPC=ON)
#
# Checks: three decisions and a generate() after them, on the device and all on the CPU, with the
# same ubatch split on both sides; reports the largest log-prob and logit differences (a real GPU
# rounds differently from the CPU: the tolerance --tol applies there; the RPC stand-in must be 0)
# and checks prefill_dev_tokens against the ubatch split. Timing: a --prompt-tokens prompt
# prefilled --reps times, device and CPU interleaved, median seconds and the ratio. One JSON line
# (BENCH_PREFILL_DEVICE) at the end. Exit 1 when a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
exec "$PY" - "$@" <<'PYEOF'
import argparse, json, statistics, sys, time

import numpy as np

from bmoe.config import SessionConfig
from bmoe.decide.types import DecideRequest
from bmoe.llama.devices import list_devices, ubatch_widths
from bmoe.runtime.results import GenerateRequest
from bmoe.session import Session
from bmoe.testing import default_tiny_dir, write_tiny

ap = argparse.ArgumentParser(prog="bench/prefill_device.sh")
ap.add_argument("--device", help="device name (bmoe-cli --list-devices); default: the first GPU")
ap.add_argument("--rpc", action="store_true", help="use the RPC stand-in device (test hook; bit equality expected)")
ap.add_argument("--model", default="tiny:qwen3moe", help="GGUF path, or tiny:ARCH (default tiny:qwen3moe, q8_0)")
ap.add_argument("--min-tokens", type=int, default=32)
ap.add_argument("--ubatch", type=int, default=64)
ap.add_argument("--prompt-tokens", type=int, default=512)
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--threads", type=int, default=0)
ap.add_argument("--tol", type=float, default=0.05, help="largest |d log p| accepted on a real device")
ap.add_argument("--moe-stream", action="store_true")
ap.add_argument("--cache-mb", default="0")
sys.path.insert(0, "bench")
import record  # bench/record.py: one record per run, as every bench writes

record.add_args(ap)
a = ap.parse_args()

if a.rpc:
    from bmoe.llama import rpc_device

    device, tol = rpc_device.rpc_prefill_device(a.min_tokens).name, 0.0
else:
    gpus = [d.name for d in list_devices() if d.kind in ("gpu", "igpu")]
    device, tol = a.device or (gpus[0] if gpus else None), a.tol
    if device is None:
        print("bench/prefill_device.sh: no GPU in this llama-cpp-python (bmoe-cli --list-devices); nothing to measure. "
              "Install one built for your GPU, e.g. CMAKE_ARGS=-DGGML_CUDA=on, or run with --rpc.")
        sys.exit(0)

model = write_tiny(a.model.split(":", 1)[1], "q8_0", default_tiny_dir()) if a.model.startswith("tiny:") else a.model
cache = a.cache_mb if a.cache_mb == "auto" else int(a.cache_mb)
base = dict(model=model, n_ctx=max(1024, a.prompt_tokens + 64), n_batch=max(512, a.ubatch), n_ubatch=a.ubatch,
            n_threads=a.threads, n_predict=16, decide=True, moe_stream=a.moe_stream, cache_mb=cache, cache_force=a.moe_stream)
dev = Session(SessionConfig(**base, prefill_device=device, prefill_min_tokens=a.min_tokens))
cpu = Session(SessionConfig(**base, decide_prefix_cache="off"))

P1 = "You control a phone. Task: turn on Wi-Fi. History:"
P2 = P1 + " opened Settings, opened Network."
REQ = [(P1, " none. Screen: Home. Options: A) Open Settings B) Open Camera C) Call Mom. Answer with the letter."),
       (P1, " none. Screen: Settings. Options: A) Network B) Display C) Battery. Answer with the letter."),
       (P2, " Screen: Network. Options: A) Bluetooth B) Internet C) Hotspot. Answer with the letter.")]
fails, d_logp, d_logit, same_best = [], 0.0, 0.0, True
expect = lambda n: sum(w for w in ubatch_widths(n, base["n_batch"], a.ubatch) if w >= a.min_tokens)
for i, (prefix, suffix) in enumerate(REQ):
    r = DecideRequest(id=i, prefix=prefix, suffix=suffix, choices=("A", "B", "C"))
    x, y = dev.decide(r), cpu.decide(r)
    d_logp = max(d_logp, float(np.max(np.abs(np.subtract(x.scores.choice_logp, y.scores.choice_logp)))))
    d_logit = max(d_logit, float(np.max(np.abs(dev.decider.decider.seq.last_logits() - cpu.decider.decider.seq.last_logits()))))
    same_best &= x.scores.best == y.scores.best
    if x.prefill_dev_tokens != expect(x.n_tokens):
        fails.append(f"decision {i}: prefill_dev_tokens {x.prefill_dev_tokens}, split says {expect(x.n_tokens)}")
g = GenerateRequest(prompt=P2 + REQ[2][1], keep_logits=True)
ga, gb = dev.generate(g), cpu.generate(g)
n_same = next((k for k, (s, t) in enumerate(zip(ga.tokens, gb.tokens)) if s != t), min(len(ga.tokens), len(gb.tokens)))
d_gen = max((float(np.max(np.abs(u - v))) for u, v in zip(ga.logits[: n_same + 1], gb.logits[: n_same + 1])), default=0.0)
if ga.prefill_dev_tokens != expect(ga.n_prompt):
    fails.append(f"generate: prefill_dev_tokens {ga.prefill_dev_tokens}, split says {expect(ga.n_prompt)}")
if d_logp > tol:
    fails.append(f"choice log-probs differ by {d_logp:.3g} > tol {tol}")
if tol == 0.0 and (d_logit or d_gen or ga.tokens != gb.tokens):
    fails.append("the RPC stand-in must equal the CPU bit for bit")

rng = np.random.default_rng(0)
prompt = [int(t) for t in rng.integers(100, min(dev.model.n_vocab, 30000), a.prompt_tokens)]
times = {"device": [], "cpu": []}
for s in (dev, cpu):
    s.next_token_logprobs(prompt[:64])  # first-use costs out of the clock
for _ in range(a.reps):
    for name, s in (("device", dev), ("cpu", cpu)):
        t0 = time.perf_counter()
        s.next_token_logprobs(prompt)
        times[name].append(time.perf_counter() - t0)
med = {k: statistics.median(v) for k, v in times.items()}
out = {
    "device": device, "description": dev.runtime.prefill_device.description, "model": str(model), "moe_stream": a.moe_stream,
    "min_tokens": a.min_tokens, "n_ubatch": a.ubatch, "max_abs_dlogp": d_logp, "max_abs_dlogit_decide": d_logit,
    "max_abs_dlogit_generate": d_gen, "same_best": same_best, "gen_tokens_equal": ga.tokens == gb.tokens,
    "gen_first_divergence": None if ga.tokens == gb.tokens else n_same, "prompt_tokens": a.prompt_tokens,
    "prefill_dev_tokens": dev.runtime.ctx.n_dev_tokens, "prefill_s_device": med["device"], "prefill_s_cpu": med["cpu"],
    "prefill_tps_device": a.prompt_tokens / med["device"], "prefill_tps_cpu": a.prompt_tokens / med["cpu"],
    "speedup": med["cpu"] / med["device"], "fails": fails,
}
print(f"{device}: |d log p| <= {d_logp:.3g}, |d logit| <= {max(d_logit, d_gen):.3g}, best agrees: {same_best}, "
      f"generated tokens equal: {ga.tokens == gb.tokens}")
print(f"prefill {a.prompt_tokens} tokens: device {med['device']:.3f} s, CPU {med['cpu']:.3f} s "
      f"(x{out['speedup']:.2f}); {'FAIL: ' + '; '.join(fails) if fails else 'checks pass'}")
print("BENCH_PREFILL_DEVICE " + json.dumps(out))
dev.close(); cpu.close()
if not a.rpc or a.results:  # the RPC stand-in is a test hook: its record only where asked for
    cols = (("name", "run", ""), ("prefill_s", "prefill s (median)", ".3f"), ("tok_s", "prefill tok/s", ".1f"))
    rows = [{"name": "CPU", "prefill_s": med["cpu"], "tok_s": out["prefill_tps_cpu"]},
            {"name": f"device {device}", "prefill_s": med["device"], "tok_s": out["prefill_tps_device"]}]
    checks = {k: v for k, v in out.items() if k not in ("fails", "description") and not k.startswith("prefill_")}
    record.write(record.record(
        "prefill_device", command="bench/prefill_device.sh " + " ".join(sys.argv[1:]),
        config={k: v for k, v in vars(a).items() if k != "results"},
        tables=[record.table(f"Prefill of {a.prompt_tokens} tokens, device against CPU", cols, rows,
                             {"row": "CPU", "key": "tok_s", "label": "x the CPU's rate"}),
                record.figures("The checks", checks)],
        targets=[record.target(f"choice log-probs within {tol:g}", d_logp, f"<= {tol:g}", d_logp <= tol),
                 record.target("prefill_dev_tokens follow the ubatch split", len(fails), "0 fails", not fails)],
    ), a.results)
sys.exit(1 if fails else 0)
PYEOF
