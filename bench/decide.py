"""Benchmark: a decision that restores a grown prefix, against the same decision prefilled whole.

An agent's prompt grows by one step per decision. At each size (prefixes of about 100, 1000 and
3000 tokens) this script keeps the state of the previous step's prefix, then times, interleaved
and repeated:

* restored: ``Session.decide`` on the grown prefix + suffix with the kept state on
  (``reuse == "restored+stored"``): restore, prefill the new history step, store the longer
  prefix, prefill the suffix, score. Wall time of the whole call.
* whole:    the same request with ``reuse_prefix: false``: everything prefilled in one piece.
* suffix:   only the tokens the restored decision prefills (the new step and the suffix), as one
  prefill on top of the restored state, with the restore itself left out of the clock.

The goal checked here is "a restored decision costs no more than its suffix's prefill plus
20 ms": margin = restored wall - suffix prefill, as the median of per-repetition differences (the
pair runs back to back, so load from other processes hits both sides alike). It is a comparison
made inside one run, never a wall-time assertion; the machine may be shared and noisy.

    .venv/bin/python bench/decide.py [--model PATH | --model tiny:qwen35moe] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from bmoe.config import SessionConfig
from bmoe.decide.kept_prefix import KeptPrefix
from bmoe.decide.port import KeptState
from bmoe.decide.prompt_split import SplitPrompt, split_prompt
from bmoe.decide.types import DecideRequest, DecideResult
from bmoe.runtime.decide import saved_bytes
from bmoe.session import Session
from bmoe.state_store import StateStore
from bmoe.testing import default_tiny_dir, smollm2_gguf_path, write_tiny

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402

GOAL_MARGIN_MS = 20.0
DEFAULT_SIZES = (100, 1000, 3000)
CHOICES = ("A", "B", "C")

HEAD = (
    "You control an Android phone for the user. Each turn you see the current screen and a few "
    "options, and you answer with the letter of the option that moves the task forward. "
    "Task: turn on Wi-Fi, then check that the phone is connected. History:"
)
SUFFIX = " Screen: Wi-Fi. Options: A) Turn Wi-Fi on B) Go back C) Open Bluetooth. Answer with the letter."
# The agent wanders through these screens; each history step names one move.
_SCREENS = (
    "Home",
    "Settings",
    "Network",
    "Display",
    "Battery",
    "Sound",
    "Apps",
    "Storage",
    "Bluetooth",
    "Hotspot",
    "Accessibility",
    "Privacy",
    "Location",
    "Security",
)
_ACTIONS = ("opened", "scrolled down on", "went back from", "searched in", "tapped the header of")


def history_step(i: int) -> str:
    """Step ``i`` of a deterministic agent history (about 20 tokens)."""
    screen = _SCREENS[(i * 5 + 1) % len(_SCREENS)]
    nxt = _SCREENS[(i * 5 + 6) % len(_SCREENS)]
    action = _ACTIONS[i % len(_ACTIONS)]
    return f" Step {i + 1}: {action} {screen}, chose {CHOICES[i % 3]}, landed on {nxt}."


def history(n_steps: int) -> str:
    return HEAD + "".join(history_step(i) for i in range(n_steps))


@dataclass(frozen=True, slots=True)
class Point:
    """One measured size: the previous step's prefix (kept) and the grown one (decided on)."""

    target: int
    n_steps: int  # history steps in the grown prefix
    prev_prefix: str
    grown_prefix: str


def choose_points(count_tokens: Callable[[str], int], targets: Sequence[int]) -> list[Point]:
    """For each target, the first history length whose rendered prefix reaches it. One history
    serves every size, so the smaller prefixes are literally earlier states of the same agent."""
    points: list[Point] = []
    n = 1
    for target in sorted(targets):
        while count_tokens(history(n)) < target:
            n += 1
        points.append(Point(target, n, history(n - 1), history(n)))
    return points


@dataclass(slots=True)
class Pair:
    """One back-to-back run of the two sides the goal compares (seconds)."""

    restored_wall_s: float  # the whole Session.decide call
    restored_prefill_s: float  # its two prefill pieces (new history step, then the suffix)
    restore_s: float
    store_s: float
    suffix_prefill_s: float  # the same not-restored tokens, one prefill, no restore on the clock


@dataclass(slots=True)
class Whole:
    """One run of the same decision with reuse_prefix false (seconds)."""

    wall_s: float
    prefill_s: float


@dataclass(slots=True)
class SizeResult:
    target: int
    n_steps: int
    n_tokens: int  # the whole prompt
    n_prefix: int  # the grown prefix on tokens (what the restored decision stores)
    n_reused: int  # restored from the previous step's state
    n_prefilled: int  # n_tokens - n_reused: the "suffix" the goal is measured against
    prefix_state_mib: float  # RAM the kept state holds after the restored decision (0: in the sequence)
    prev_state_mib: float  # the size of the state it restored, as a copy
    answer: int
    choice_logp: list[float]
    whole_choice_logp: list[float]
    scores_stable: bool  # every restored repetition scored bit for bit the same
    # medians (seconds)
    whole_wall_s: float
    whole_prefill_s: float
    restored_wall_s: float
    restored_prefill_s: float
    restore_s: float
    store_s: float
    suffix_prefill_s: float
    # The goal: median over pairs of (restored wall - suffix prefill), and its two parts:
    # everything outside prefill (restore, store, render, tokenize, score), and what prefilling
    # the not-restored tokens in two pieces costs over one.
    margin_ms: float
    margin_min_ms: float
    outside_prefill_ms: float
    two_pieces_ms: float
    ratio_restored_to_suffix: float
    speedup_vs_whole: float
    passed: bool
    pairs: list[Pair] = field(default_factory=list)
    wholes: list[Whole] = field(default_factory=list)


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def _request(i: int, prefix: str, *, reuse: bool = True) -> DecideRequest:
    return DecideRequest(id=i, prefix=prefix, suffix=SUFFIX, choices=CHOICES, reuse_prefix=reuse)


def _expect(result: DecideResult, reuse: str) -> DecideResult:
    # A benchmark that silently measured the wrong path would be worse than none.
    if result.error is not None or result.reuse != reuse:
        raise RuntimeError(f"expected reuse {reuse!r}, got {result.reuse!r} (error: {result.error})")
    return result


class Bench:
    def __init__(self, session: Session) -> None:
        if session.decider is None or not session.decider.decider.policy.keep_prefix:
            raise ValueError("the session needs decide on and a prefix cache")
        self.s = session
        decider = session.decider.decider
        self.text, self.seq = decider.text, decider.seq
        cache = decider.store
        if not isinstance(cache, StateStore):
            raise TypeError("the benchmark resets the kept state through the session's StateStore")
        self.cache = cache
        self._ids = iter(range(1, 1 << 30))

    def count_prefix_tokens(self, prefix: str) -> int:
        return len(self.s.tokenize_prompt(self.text.render_user(prefix)))

    def warm_up(self, point: Point) -> None:
        """One untimed whole decision: the first touches of the weights and buffers."""
        _expect(self.s.decide(_request(next(self._ids), point.grown_prefix, reuse=False)), "opted out")
        self.cache.drop()
        self.seq.keep(())

    def _keep(self, kept: KeptPrefix, after: Sequence[int] = ()) -> None:
        """Make ``kept`` the kept state again, held in the sequence as the previous step left it:
        the kept prefix, then that step's ``after`` tokens (its suffix). Untimed. The restored
        decision then gets its state back the way an agent's next step does: by a cut on
        attention-only models, by a copy on hybrid ones. Re-running the previous step instead
        would cost a whole prefix per repetition and time nothing."""
        self.cache.store(kept.tokens, kept.state)
        self.seq.keep((kept,))  # what the decider passes down whenever its store changes
        self.seq.load_state(kept.state)
        if after:
            self.seq.prefill(after, kept.state.n_tokens)

    def _restored(self, point: Point, kept: KeptPrefix, prev: SplitPrompt) -> tuple[DecideResult, float]:
        self._keep(kept, prev.tokens[kept.state.n_tokens :])
        t0 = time.perf_counter()
        r = self.s.decide(_request(next(self._ids), point.grown_prefix))
        wall = time.perf_counter() - t0
        _expect(r, "restored+stored")
        if r.n_reused != kept.state.n_tokens:
            raise RuntimeError(f"restored {r.n_reused} tokens, the kept state holds {kept.state.n_tokens}")
        return r, wall

    def _suffix(self, prompt: SplitPrompt, kept: KeptPrefix) -> float:
        n = kept.state.n_tokens
        self._keep(kept)  # not timed: this side is the prefill alone
        return self.seq.prefill(prompt.tokens[n:], n).prefill_s

    def _whole(self, point: Point) -> tuple[DecideResult, float]:
        t0 = time.perf_counter()
        r = self.s.decide(_request(next(self._ids), point.grown_prefix, reuse=False))
        wall = time.perf_counter() - t0
        return _expect(r, "opted out"), wall

    def measure(self, point: Point, pair_reps: int, whole_reps: int) -> SizeResult:
        self.cache.drop()  # the previous size's state is a shorter prefix of this history
        self.seq.keep(())
        _expect(self.s.decide(_request(next(self._ids), point.prev_prefix)), "stored")
        stored = self.cache.kept
        assert stored is not None
        # The benchmark restores this state again and again, after the adapter has moved on to
        # newer ones: it needs a copy of its own. Clearing the sequence makes the adapter copy the
        # kept state out (attention-only models keep it in the sequence until then).
        self.seq.clear()
        kept = KeptPrefix(
            stored.tokens, KeptState(data=np.array(saved_bytes(stored.state)), n_tokens=stored.state.n_tokens)
        )
        prompt = split_prompt(self.text, point.grown_prefix, SUFFIX)
        prev = split_prompt(self.text, point.prev_prefix, SUFFIX)  # what the previous step prefilled
        assert prev.n_prefix == kept.state.n_tokens
        pairs: list[Pair] = []
        wholes: list[Whole] = []
        restored: list[DecideResult] = []
        whole_result: DecideResult | None = None
        # Wholes are spread among the pairs, so a quiet or busy stretch of the shared machine
        # lands on both kinds of measurement.
        every = max(1, pair_reps // max(1, whole_reps))
        for i in range(max(pair_reps, whole_reps)):
            if i < pair_reps:
                # Alternate which side runs first: the first after a whole prefill may find
                # caches colder.
                if i % 2 == 0:
                    r, wall = self._restored(point, kept, prev)
                    suffix_s = self._suffix(prompt, kept)
                else:
                    suffix_s = self._suffix(prompt, kept)
                    r, wall = self._restored(point, kept, prev)
                restored.append(r)
                pairs.append(Pair(wall, r.prefill_s, r.restore_s, r.store_s, suffix_s))
            if len(wholes) < whole_reps and (i % every == every - 1 or i >= pair_reps):
                whole_result, wall = self._whole(point)
                wholes.append(Whole(wall, whole_result.prefill_s))
        last = restored[-1]
        assert last.scores is not None and whole_result is not None and whole_result.scores is not None
        margins = [(p.restored_wall_s - p.suffix_prefill_s) * 1e3 for p in pairs]
        restored_wall = _median([p.restored_wall_s for p in pairs])
        suffix_s = _median([p.suffix_prefill_s for p in pairs])
        whole_wall = _median([w.wall_s for w in wholes])
        margin = _median(margins)
        return SizeResult(
            target=point.target,
            n_steps=point.n_steps,
            n_tokens=last.n_tokens,
            n_prefix=prompt.n_prefix,
            n_reused=last.n_reused,
            n_prefilled=last.n_tokens - last.n_reused,
            prefix_state_mib=last.prefix_state_mib,
            prev_state_mib=kept.state.mib,
            answer=last.scores.best,
            choice_logp=list(last.scores.choice_logp),
            whole_choice_logp=list(whole_result.scores.choice_logp),
            scores_stable=all(r.scores is not None and r.scores == last.scores for r in restored),
            whole_wall_s=whole_wall,
            whole_prefill_s=_median([w.prefill_s for w in wholes]),
            restored_wall_s=restored_wall,
            restored_prefill_s=_median([p.restored_prefill_s for p in pairs]),
            restore_s=_median([p.restore_s for p in pairs]),
            store_s=_median([p.store_s for p in pairs]),
            suffix_prefill_s=suffix_s,
            margin_ms=margin,
            margin_min_ms=min(margins),
            outside_prefill_ms=_median([(p.restored_wall_s - p.restored_prefill_s) * 1e3 for p in pairs]),
            two_pieces_ms=_median([(p.restored_prefill_s - p.suffix_prefill_s) * 1e3 for p in pairs]),
            ratio_restored_to_suffix=restored_wall / suffix_s,
            speedup_vs_whole=whole_wall / restored_wall,
            passed=margin <= GOAL_MARGIN_MS,
            pairs=pairs,
            wholes=wholes,
        )


def resolve_model(spec: str | None) -> tuple[Path, str]:
    """``None`` (SmolLM2-135M-Instruct), a path, or ``tiny:ARCH`` (a generated q8_0 fixture)."""
    if spec is None:
        path = smollm2_gguf_path()
        return path, "SmolLM2-135M-Instruct Q4_1"
    if spec.startswith("tiny:"):
        arch = spec.removeprefix("tiny:")
        return write_tiny(arch, "q8_0", default_tiny_dir()), f"tiny {arch} q8_0"
    return Path(spec), Path(spec).name


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def print_table(results: list[SizeResult]) -> None:
    head = [
        "prefix tok",
        "n_tokens",
        "n_reused",
        "prefilled",
        "whole s",
        "restored s",
        "restore ms",
        "store ms",
        "suffix s",
        "restored-suffix ms",
        "(outside prefill",
        "two pieces)",
        "restored/suffix",
        "whole/restored",
        "state MiB (copy / held)",
        "goal",
    ]
    print(_row(head))
    print(_row(["---"] * len(head)))
    for r in results:
        print(
            _row(
                [
                    str(r.n_prefix),
                    str(r.n_tokens),
                    str(r.n_reused),
                    str(r.n_prefilled),
                    f"{r.whole_wall_s:.3f}",
                    f"{r.restored_wall_s:.3f}",
                    f"{r.restore_s * 1e3:.1f}",
                    f"{r.store_s * 1e3:.1f}",
                    f"{r.suffix_prefill_s:.3f}",
                    f"{r.margin_ms:+.1f}",
                    f"{r.outside_prefill_ms:.1f}",
                    f"{r.two_pieces_ms:+.1f}",
                    f"{r.ratio_restored_to_suffix:.2f}",
                    f"{r.speedup_vs_whole:.1f}x",
                    f"{r.prev_state_mib:.1f} / {r.prefix_state_mib:.1f}",
                    "PASS" if r.passed else "FAIL",
                ]
            )
        )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="GGUF path or tiny:ARCH (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--out", type=Path, default=Path("bench/out/decide.json"))
    ap.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=list(DEFAULT_SIZES),
        help="approximate prefix lengths in tokens (default: 100 1000 3000)",
    )
    ap.add_argument(
        "--reps", type=int, default=15, help="restored/suffix pairs per size (cheap; the goal's margin is their median)"
    )
    ap.add_argument(
        "--whole-reps", type=int, default=5, help="whole-prefill decisions per size (costly at 3000 tokens)"
    )
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=0, help="0: all cores")
    record.add_args(ap)
    args = ap.parse_args(argv)
    if args.reps < 1 or args.whole_reps < 1:
        ap.error("--reps and --whole-reps must be at least 1")

    path, name = resolve_model(args.model)
    config = SessionConfig(model=path, n_ctx=args.n_ctx, n_threads=args.threads, decide=True, decide_prefix_cache="on")
    load_before = os.getloadavg()
    started = time.time()
    with Session(config) as session:
        bench = Bench(session)
        points = choose_points(bench.count_prefix_tokens, args.sizes)
        bench.warm_up(points[0])
        results: list[SizeResult] = []
        for point in points:
            r = bench.measure(point, args.reps, args.whole_reps)
            print(f"# {name}: prefix {r.n_prefix} tokens: {r.margin_ms:+.1f} ms", file=sys.stderr)
            results.append(r)
        threads = session.config.threads
    print(
        f"# {name}, n_ctx {args.n_ctx}, {threads} threads; medians of {args.reps} pairs "
        f"and {args.whole_reps} whole prefills per size"
    )
    print_table(results)
    verdict = all(r.passed for r in results)
    print(
        f"# goal: restored decision <= suffix prefill + {GOAL_MARGIN_MS:.0f} ms: "
        f"{'PASS' if verdict else 'FAIL'} "
        f"({', '.join(f'{r.n_prefix}: {r.margin_ms:+.1f} ms' for r in results)})"
    )

    report = {
        "model": name,
        "model_path": str(path),
        "n_ctx": args.n_ctx,
        "n_threads": threads,
        "n_batch": config.n_batch,
        "n_ubatch": config.n_ubatch,
        "pair_reps": args.reps,
        "whole_reps": args.whole_reps,
        "goal_margin_ms": GOAL_MARGIN_MS,
        "passed": verdict,
        "machine": record.machine(disk=path),
        "load_avg_before": load_before,
        "started_unix": started,
        "wall_s": time.time() - started,
        "command": " ".join(["bench/decide.py", *(sys.argv[1:] if argv is None else argv)]),
        "sizes": [asdict(r) for r in results],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"# wrote {args.out}")
    cols = (
        ("name", "prefix tokens", "d"),
        ("n_prefilled", "prefilled", "d"),
        ("whole_wall_s", "whole decision s", ".3f"),
        ("restored_wall_s", "restored decision s", ".3f"),
        ("suffix_prefill_s", "suffix prefill s", ".3f"),
        ("margin_ms", "restored - suffix ms", "+.1f"),
        ("prefix_state_mib", "state MiB held", ".1f"),
    )
    rows = [{"name": r.n_prefix, **asdict(r)} for r in results]
    for row in rows:
        row.pop("choice_logp"), row.pop("whole_choice_logp")
    rec = record.record(
        "decide",
        command=str(report["command"]),
        config={
            k: v
            for k, v in report.items()
            if k in ("model", "n_ctx", "n_threads", "n_batch", "n_ubatch", "pair_reps", "whole_reps")
        },
        tables=[record.table(f"{name}: a restored grown prefix against the whole prefill", cols, rows)],
        targets=[
            record.target(
                f"restored decision <= suffix prefill + {GOAL_MARGIN_MS:.0f} ms, prefix of {r.n_prefix} tokens",
                r.margin_ms,
                f"<= +{GOAL_MARGIN_MS:.0f} ms",
                r.passed,
            )
            for r in results
        ],
        machine_facts=report["machine"],  # type: ignore[arg-type]
    )
    record.write(rec, args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
