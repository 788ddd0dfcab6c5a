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

Every figure on this page comes from a record a bench run wrote (`bench/results/<bench>/<date>.json`,
made by bench/record.py) and is rendered by `bench/render.py`; tests/test_bench_render.py fails when
this page and the committed records disagree. Each section says what its bench measures, the command
that reproduces it, the machine it ran on, and the latest run's tables and targets. A later partial
run (a subset of the configurations) shows under the full run it refines. Older runs live in git
and, where another page cites them, in their records.

How to read the figures:

- **Compare within one run.** The machine is a shared 2-core VM whose speed moved by 10-30% between
  sittings, and two CPUs took turns (an AMD EPYC, and an Intel Xeon about 2.6x slower in compute).
  So each table carries a baseline from the same run, and its last column divides by it.
- **Targets are printed, never asserted** (docs/testing.md). Bytes, hits, tokens and answers are
  exact; times are medians of a few rounds, and rounds more than about 20% apart are noise. With
  2 threads, llama.cpp collapses when another job takes a core: `-t 1` is the remedy on a busy box.

**The bench model.** bench/synthetic_moe.py writes a `qwen3moe` GGUF with Qwen3-30B-A3B's layer
shapes (hidden 2048, 32 query and 4 KV heads of 128, 128 experts of FFN 768, top-8) but 16 layers:
5.34 GiB, of which 5184 MiB experts and 286 MiB dense; one token's routed experts are 324 MiB. Its
weights are random Q4_0. Two routing presets: `uniform` (every expert about equally likely, a token
shares 6-7% of its experts with the previous one: the worst case for a cache) and `trace`, whose
expert popularity and previous-token reuse were fitted to a recorded Qwen3-30B-A3B trace
([the routing statistics](#the-bench-models-routing-against-recorded-traces)).
`bench/synthetic_moe.py --preset uniform|trace --work bench/out` writes either; the benches write
what they need. The memory-limited runs need root, a cgroup-v1 memory controller and about 6 GB
under `bench/out/` (git ignores it)."""

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
        "over the grid's best. No llama.cpp row: the plan bench does not run it (decide_stream's "
        "llama.cpp mmap row is at 2.5 GiB only).",
        "sudo .venv/bin/python bench/plan.py --limits 2 2.5 4 8 0 --preset uniform trace --decisions 5   # ~80 minutes",
    ),
    Bench(
        "decide_batch",
        "Batched decisions",
        "what does answering 16 decisions as one batch save, in bytes and time?",
        "`bench/decide_batch.py`: 16 decisions on one kept prefix answered by `decide_many` (one batch) "
        "against the same 16 by `decide` one by one, streamed under the 2.5 GiB limit with the cache off "
        "and at 1024 MiB, the batch resident and warm (its compute floor, median of 3 processes), and "
        "SmolLM2 resident in turns. The ratio column divides the batch's time by its compute floor.",
        ".venv/bin/python bench/decide_batch.py   # about 15 minutes",
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

UNRECORDED = """\
## Benches with no record yet

bench/decide.py (a restored grown prefix against the whole prefill) and bench/decide_kquant.py
(exact K-quant batches) quote their last runs in [decide.md](decide.md#measured),
bench/ray_batch.py in [scale-out.md](scale-out.md#measured), bench/plan_floor.py in
[plan.md](plan.md#small-memory-limits-3811-2026-12-05), and bench/content_check.py,
bench/stream_phases.py and bench/stream_predict.py in [streaming.md](streaming.md). Each writes its
record from its next run on, and its section here with it."""

FOOTER = """\
## Updating this page

Run the bench: it writes its record under `bench/results/<bench>/` (`--results DIR` elsewhere), with
the machine it ran on (CPU model and flags, cores, memory and its limit, the disk read rate bmoe's
probe remembered, kernel, llama-cpp-python), the commit and the date. Then
`.venv/bin/python bench/render.py` rewrites this page and its plots under `docs/img/bench/`; commit
the three together. A record keeps tables and targets, not traces (the bench's own JSON under
`--work` keeps every raw number). The records older than bench/record.py were transcribed from this
page's earlier versions: what was never written down about their machine is `unknown`, with a note."""
