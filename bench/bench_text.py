"""The words of docs/benchmarks.md that no record holds: what each bench measures, against what,
and the command that reproduces it (bench/render.py puts the records' figures under them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bench:
    key: str  # the records' "bench"
    title: str
    question: str  # the question it answers, one line (the summary table)
    what: str  # what it measures and against what baseline
    command: str  # the command that reproduces the latest run's kind


HEADER = """\
# Benchmarks

<!-- Rendered by bench/render.py from bench/results/; edit those, not this page. -->

Every figure here comes from a record a bench run wrote (`bench/results/<bench>/<date>.json`, see
bench/record.py); `bench/render.py` renders the page and tests/test_bench_render.py fails when page
and records disagree. Each section: what the bench measures, its command, its latest full run
(else its latest partial one) with machine and load, its other runs as links.

- **Compare within one run.** The machine is a shared 2-core VM (an AMD EPYC and an Intel Xeon about
  2.6x slower took turns), so each table carries a baseline from the same run and its last column
  divides by it. Rounds more than about 20% apart are noise; the load average says why.
- **Targets are printed, never asserted** (docs/testing.md). Bytes, hits, tokens and answers are
  exact; times are medians of a few rounds.
- **The bench model** (bench/synthetic_moe.py) has Qwen3-30B-A3B's layer shapes (128 experts of FFN
  768, top-8) but 16 layers: 5.34 GiB of random Q4_0, one token's routed experts 324 MiB. Routing
  preset `uniform` is the worst case for a cache; `trace` is fitted to a recorded Qwen3-30B-A3B trace
  ([its statistics](#the-bench-models-routing-against-recorded-traces)). The memory-limited runs
  need root, a cgroup-v1 memory controller and about 6 GB under `bench/out/`."""

BENCHES = (
    Bench(
        "stream",
        "Decode under a memory limit",
        "how fast does a model 2x bigger than the memory limit decode, against llama.cpp's mmap?",
        "`bench/stream.py` decodes greedily on the `uniform` bench model, each configuration in its own "
        "child and its own 2.5 GiB memory cgroup with the page cache dropped, three rounds in turn (the "
        "median round is shown): llama.cpp's mmap (its way to run a model bigger than RAM; its default "
        "load, which repacks every expert, cannot load under the limit), bmoe with the expert cache off, "
        "with `--prefetch`, and with a 1024 MiB cache. Then warm with no limit, in one process, in turns: "
        "plain llama.cpp, resident bmoe, and a streamed bmoe whose cache holds every expert (its gap to "
        "resident is what streaming costs besides reads). `x I/O bound` is the rate reads alone would allow "
        "(the run's read bandwidth over the bytes per token) divided by the measured rate; issue #29 "
        "restated the cache-off targets against the slower of that bound and the resident compute floor. "
        "The ratio column divides by llama.cpp mmap's decode rate.",
        "sudo .venv/bin/python bench/stream.py --threads 2 --skip-oom-demo   # ~6 minutes; --only off prefetch paired for a subset",
    ),
    Bench(
        "decide_stream",
        "Decisions on a model bigger than RAM",
        "how long does an agent's decision take under a 2.5 GiB limit, per streaming configuration?",
        "`bench/decide_stream.py` answers the same agent decisions (a ~340-token kept prefix, ~30-token "
        "suffixes, four letter choices) on both presets, every configuration in its own child under the "
        "2.5 GiB cgroup: llama.cpp mmap (trimming its KV back to the prefix), bmoe with the cache off and "
        "with caches of 15% and 30% of the expert bytes, each with and without read-ahead (`+ra`, "
        "`--prefetch`), the caches under plain LRU and with page moves (the cache's memory before slots) "
        "for comparison, and the model resident with no limit (the compute floor). A row is the median "
        "over decisions 2..N of all rounds. `bound s` is the slower of the decision's I/O bound (the "
        "routed bytes the cache did not hold, over the fastest read rate of the run) and its compute "
        "floor. The ratio column divides by llama.cpp mmap's latency.",
        "sudo .venv/bin/python bench/decide_stream.py --threads 2 --rounds 2   # ~40 minutes; --only and --preset for a subset",
    ),
    Bench(
        "plan",
        "The plan against hand-picked flags",
        "does the plan (no flags) choose as well as the best hand-picked configuration at each memory limit?",
        "`bench/plan.py` runs, at each memory limit and preset, the session with no streaming, thread or "
        "batch flag (the plan, [plan.md](plan.md)) against decide_stream's hand-picked grid (cache off "
        "with read-ahead, caches of 15% and 30% with read-ahead, 30% without), plus a 1291-token "
        "decision by the plan and by the grid's fastest. The ratio column is the plan's decision latency "
        "over the grid's best. With `--grid llama` it also runs llama.cpp mmap at each limit (the "
        "baseline of the plot's third line; never a grid choice), which makes the run partial.",
        "sudo .venv/bin/python bench/plan.py --limits 2 2.5 4 8 0 --preset uniform trace --decisions 5   # ~80 minutes",
    ),
    Bench(
        "decide_batch",
        "Batched decisions",
        "what does answering 16 decisions as one batch save, in bytes and time?",
        "`bench/decide_batch.py`: 16 decisions on one kept prefix answered by `decide_many` (one batch) "
        "against the same 16 by `decide` one by one, streamed under the 2.5 GiB limit with the cache off "
        "and at 1024 MiB, the batch resident and warm (its compute floor, median of 3 processes), and "
        "SmolLM2 resident in turns. The ratio column divides the batch's time by its compute floor. "
        "`sizes` sweeps the batch size instead (1, 2, 4, 8, 16: the 16 decisions in slices of that size), "
        "streamed cache off under the limit and SmolLM2 resident, for the plot.",
        ".venv/bin/python bench/decide_batch.py   # about 15 minutes; add sizes --rounds 3 for the sweep",
    ),
    Bench(
        "cache_replay",
        "The cache policy on recorded routing",
        "how often does bmoe's expert cache hit on real routing, against LRU, an in-budget LFU and the optimum?",
        "`bench/cache_replay.py` replays route traces recorded on a phone (Qwen3-30B-A3B, gpt-oss-120b, "
        "Gemma-4-26B-A4B) through the policy bmoe's streamer runs, global LRU, a per-layer LFU partition "
        "that keeps to the budget, and the offline optimum (Belady), at nine budgets. No model and no "
        "disk. Leave-one-trace-out: the policy's knobs for a trace are chosen on the other two. The target "
        "per budget: bmoe at least LRU and at least the partition. These are hit rates, not speed; "
        "[decide_stream](#decisions-on-a-model-bigger-than-ram) shows whether they turn into speed.",
        ".venv/bin/python bench/cache_replay.py --loo TRACE TRACE TRACE --json   # 6.5 minutes; one trace without --loo: seconds",
    ),
    Bench(
        "routing_stats",
        "The bench model's routing against recorded traces",
        "how close does the `trace` preset route to the real Qwen3-30B-A3B trace it was fitted to?",
        "`bench/routing_stats.py` loads each preset resident, decodes 128 greedy tokens and records every "
        "layer's router probabilities, then compares them with the recorded traces (decode only, means "
        "over layers). The preset was fitted at top-6, the trace's top-k; the engine reads the top 8. "
        "`--write-trace` writes each run as a route trace that bench/cache_replay.py replays.",
        ".venv/bin/python bench/routing_stats.py --preset uniform trace --n-predict 128 --trace TRACE... --write-trace bench/out/route-traces",
    ),
    Bench(
        "decide_defaults",
        "Defaults: flash attention and threads",
        "are flash attention `auto` and all cores the right defaults for decisions?",
        "`bench/decide_stream.py --defaults` answers the agent's decisions with the cache off on the "
        "`uniform` model under the 2.5 GiB limit, with flash attention on and off, at 1 and 2 threads. "
        "The ratio column divides by the default (flash on, all cores). Why `auto` stays although off is "
        "sometimes faster: [decide.md](decide.md#what-is-exact-and-what-is-not).",
        "sudo .venv/bin/python bench/decide_stream.py --defaults --threads 2 --rounds 2",
    ),
    Bench(
        "images",
        "Images: encoding against prefill",
        "what does an image cost a decision: the vision encoder or the language model's prefill of it?",
        "`bench/images.py --bench-model` pairs the bench model with a synthetic projector of "
        "Qwen3-VL-30B-A3B's vision tower (bench/synthetic_mmproj.py: 27 blocks of 1152, the 2x2 merger "
        "into 2048, random F16, no DeepStack) and times, per image size, the encoder and the language "
        "model's prefill of the image's tokens, resident and streamed (cache off and 30%, read-ahead), "
        "with a fresh image each round. Without `--bench-model` it runs the tiny qwen3vlmoe in milliseconds.",
        ".venv/bin/python bench/images.py --bench-model --rounds 2 --sizes 256x256 512x512",
    ),
    Bench(
        "decide",
        "A kept prefix against the whole prefill",
        "what does restoring an agent's grown prefix save a decision, and what does it cost beyond the suffix's prefill?",
        "`bench/decide.py` grows an agent's prompt one step per decision and times, interleaved, the "
        "decision on the restored grown prefix, the same request prefilled whole, and the restored "
        "decision's own tokens prefilled alone (the yardstick). The goal: restored minus that prefill "
        "within 20 ms. Why it is built this way: [decide.md](decide.md#measured).",
        ".venv/bin/python bench/decide.py --threads 1   # SmolLM2; --model tiny:qwen35moe for the hybrid",
    ),
    Bench(
        "decide_kquant",
        "Exact K-quant batches",
        "what does keeping a K-quant batch bit-exact with one by one cost, against the wide batch?",
        "`bench/decide_kquant.py` times 16 decisions on a kept prefix three ways in alternating rounds: "
        "one by one, the exact batch (calls bounded below the K-quant kernel's 8-row tile) and the wide "
        "batch (the bound lifted), on SmolLM2 Q4_K_M and the tiny qwen3moe, resident and streamed. "
        "[decide.md](decide.md#what-is-exact-and-what-is-not) says why exact.",
        ".venv/bin/python bench/decide_kquant.py --rounds 5 --threads 1",
    ),
    Bench(
        "plan_floor",
        "The plan's floor: small memory limits",
        "how small a memory limit does the plan still answer under, without being OOM-killed?",
        "`bench/plan_floor.py` answers a short prompt on the bench model with no flags, each limit in a "
        "fresh cgroup with the page cache dropped: what the plan chose, whether it ran, was refused or "
        "was killed, and the rate (indicative only). [plan.md](plan.md#small-memory-limits-3811-2026-12-05) "
        "explains the floor.",
        "sudo .venv/bin/python bench/plan_floor.py --limits 0.75 1 1.25 1.5",
    ),
    Bench(
        "ray_batch",
        "Decisions over a data set with Ray",
        "do Ray actors answer a data set of decisions faster than one session, and identically?",
        "`bench/ray_batch.py` answers 6 agent prefixes x N suffixes on SmolLM2 in one session in this "
        "process and through a Ray actor pool of 1 and 2 actors on a local Ray instance (1 thread each); "
        "wall time includes starting the actors. [scale-out.md](scale-out.md#measured) reads it.",
        ".venv/bin/python bench/ray_batch.py --reps 2",
    ),
    Bench(
        "stream_phases",
        "What split-phase reads could hide",
        "how much of a decode token's compute lies between a layer's route and its down matmul?",
        "`bench/stream_phases.py` decodes the bench model resident through llama.cpp's C API and times, "
        "per token, the span between each layer's routing node and its `down` matmul (what split-phase "
        "reads can hide the `down` reads behind) against the whole token.",
        ".venv/bin/python bench/stream_phases.py",
    ),
    Bench(
        "stream_predict",
        "Guessing the next layer's experts",
        "how many of layer l+1's experts does its router, applied to layer l's output, guess?",
        "`bench/stream_predict.py` decodes the bench model resident and applies each layer's router to "
        "the previous layer's output (the guess read-ahead makes), reporting the recall of the routed "
        "experts in the guess's top k, 1.5k, 2k and 3k, and that the router on the real input "
        "reproduces the pick.",
        ".venv/bin/python bench/stream_predict.py",
    ),
    Bench(
        "content_check",
        "The content check's cost",
        "what does the sampled check that a streamed file has not changed cost, alone and per token?",
        "`bench/content_check.py` times one check of the sampled blocks, warm and after dropping the "
        "file from the page cache, then decodes streamed (cache off) in alternating rounds with the "
        "check off, on its default schedule, and forced every ubatch. "
        "[streaming.md](streaming.md#the-content-check) describes the check.",
        ".venv/bin/python bench/content_check.py",
    ),
    Bench(
        "structured",
        "Structured outputs: decisions, jump-forward, grammar overhead",
        "is an enum answer by decision 2x faster than constrained decoding, and what do jump-forward and the grammar cost?",
        "`bench/structured.py` in one run, streamed with the cache off: an enum schema answered without "
        "decoding it (the temperature-0 greedy walk, and one decision, the temperature > 0 path) against the "
        "same answer by token-by-token constrained greedy decoding, each from an empty KV; an object schema "
        "generated with and without jump-forward (answer tokens per second of decode); and decode ms/token "
        "constrained against unconstrained, with the matcher's own cost measured by replaying the answer's "
        "tokens through a fresh mask. `--bench-model` runs the bench model in a child under `--limit-gib`; "
        "without it, the tiny qwen3moe in process ([decide.md](decide.md#decisions-behind-the-standard-fields)).",
        "sudo .venv/bin/python bench/structured.py --bench-model --limit-gib 2.5 --rounds 2 --n-predict 24",
    ),
    Bench(
        "agents",
        "Many agents on one server: the state store",
        "do four agents taking turns on one server each answer as fast as one agent alone?",
        "`bench/agents.py`: four chat agents (a ~600-token history each, ~60 tokens more a step, 4-token "
        "answers) take 8 steps each round robin on one server, against one agent alone on a fresh server, "
        "each server in its own 2.5 GiB cgroup with the page cache dropped: bmoe-server with the state "
        "store (`--state-ram-mib 64 --state-disk-mib 1024`, [decide.md](decide.md#the-state-store-many-kept-states-in-ram-and-on-flash)) "
        "and llama-cpp-python's own server with its prompt cache in RAM and on disk (its repacked CPU "
        "buffers off, as bmoe loads: as shipped it died of SIGILL on this machine; and `--use_mlock false "
        "--logits_all false`: its defaults pin the whole mapped model in RAM and keep a logit row per "
        "context token, and it was OOM-killed at load under 2.5 GiB, as the 18:39 record shows). The "
        "target: the median "
        "step after each agent's first, in turns, within 1.2x of the same alone. Read from storage: "
        "/proc/PID/io of the server; the store's bytes per tier from /metrics (llama-cpp-python's disk "
        "cache: its folder).",
        "sudo .venv/bin/python bench/agents.py --threads 1 --extras DIR   # DIR: llama-cpp-python's server extras",
    ),
)

# A bench of another area registers here: one Bench(key, ...) per record folder under bench/results/
# (bench/agents.py and bench/structured.py as "agents" and "structured", say). Until it does,
# bench/render.py still shows its records, under its key, with a line asking for the entry.

FOOTER = """\
## Updating this page

Run the bench: it writes its record under `bench/results/<bench>/` (`--results DIR` or
`$BMOE_BENCH_RESULTS` elsewhere) with the machine (CPU model and flags, cores, memory and its limit,
the disk read rate bmoe's probe remembered, kernel, llama-cpp-python, the load average at the run's
start and end), the commit and the date; `BMOE_BENCH_SHORT="why"` marks a run cut shorter than the
bench's defaults (`short_run` in its config). Then `.venv/bin/python bench/render.py` rewrites this
page and its plots under `docs/img/bench/`; commit the three together. A new bench adds one `Bench`
entry in bench/bench_text.py (until then its records show under its key). Records keep tables and
targets, not traces; the records older than bench/record.py were transcribed from this page's
earlier versions, and what was never written down about their machine is `unknown`, with a note."""
