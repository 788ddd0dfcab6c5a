"""bmoe-eval: a data set of decisions with gold answers through a session; metrics, a report and
two pictures in an output folder (docs/eval.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bmoe.errors import BmoeError
from bmoe.flags import add_session_flags, config_from_flags, int_at_least, model_from_flags, opening_failure
from bmoe.ray.flags import add_actor_flags, run_failure

if TYPE_CHECKING:  # the heavy parts load only when a run needs them
    from bmoe.config import SessionConfig
    from bmoe.eval.dataset import Dataset, Row
    from bmoe.eval.runner import RunCounts
    from bmoe.eval.store import ResultStore

PROG = "bmoe-eval"
_positive = int_at_least(1)
# Session flags that only steer generation: a decision generates nothing, so bmoe-eval has none of
# them; --decide is always on.
SKIPPED_FLAGS = ("--decide", "--n-predict", "--temp", "--top-p", "--seed", "--no-think")
EXTRA = ("tqdm", "matplotlib", "scipy")
EXIT_INTERRUPTED = 130
RAY_BATCH_ROWS = 32  # with --ray, --batch's default is max(the batch width, this): rows per actor batch
# What _write_outputs writes into --out besides the store's results.jsonl and run.json (checked
# writable before any work).
OUTPUT_FILES = ("metrics.json", "report.md", "reliability.png", "coverage.png")


def _probability(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"takes a probability between 0 and 1, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Run a JSONL file of decisions with gold answers through a bmoe session and "
        "report accuracy and calibration (docs/eval.md).",
    )
    p.add_argument("data", nargs="?", type=Path, metavar="DATA.jsonl", help="the data set (or --set NAME)")
    g = p.add_argument_group("evaluation")
    g.add_argument("--set", metavar="NAME", help="a data set shipped with bmoe instead of DATA (see --list-sets)")
    g.add_argument("--list-sets", action="store_true", help="print the shipped data sets and exit")
    g.add_argument("--out", type=Path, metavar="DIR", help="output folder (made if missing; a rerun resumes)")
    g.add_argument(
        "--batch",
        type=_positive,
        default=None,
        metavar="N",
        help="rows per Session.decide_many call (default: the session's batch width, --decide-batch, 8 "
        "with auto); with --ray, rows per batch handed to an actor (default: the larger of that "
        f"and {RAY_BATCH_ROWS})",
    )
    g.add_argument(
        "--abstain-below",
        type=_probability,
        default=None,
        metavar="T",
        help="abstain_below for every row that does not set its own; reports the session's accuracy/coverage with it",
    )
    g.add_argument(
        "--scoring",
        choices=["first", "full"],
        default=None,
        help='the decide field "scoring" for every row that does not set its own (docs/decide.md)',
    )
    g.add_argument(
        "--debias",
        choices=["permute", "pride", "contextual"],
        default=None,
        help='the decide field "debias" for every row that does not set its own; rows need the '
        'structured form (question, options). The report gives raw and debiased figures',
    )
    g.add_argument(
        "--fit-temperature",
        action="store_true",
        help="fit a temperature on the rows of --calib-split, report the other rows before and after",
    )
    g.add_argument(
        "--calib-split", default="calib", metavar="NAME", help="the split --fit-temperature fits on (default calib)"
    )
    g.add_argument(
        "--ray",
        metavar="ADDRESS|local",
        default=None,
        help="answer the rows on a Ray actor pool: a cluster's address, or local (docs/scale-out.md)",
    )
    g.add_argument(
        "--actors", type=_positive, default=None, metavar="N", help="with --ray: actors, one session each (default 1)"
    )
    add_actor_flags(g)  # with --ray, as bmoe-batch's
    g.set_defaults(actor_cpus=None)  # 1, but "given" is told apart from it
    g.add_argument("--debug", action="store_true", help="on a fatal error, print the Python traceback too")
    add_session_flags(p, skip=SKIPPED_FLAGS)
    return p


def _say(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list_sets:
        from bmoe.eval.dataset import load, shipped_sets

        for name, path in shipped_sets().items():
            print(f"{name}\t{len(load(path).rows)} rows\t{path}")
        return 0
    if (args.data is None) == (args.set is None):
        parser.error("give the data set: a DATA.jsonl path or --set NAME (one of the two)")
    if args.out is None:
        parser.error("--out DIR is required: the folder for results.jsonl, metrics.json, report.md and the pictures")
    if args.calib_split != "calib" and not args.fit_temperature:
        parser.error("--calib-split needs --fit-temperature")
    for flag, given in (
        ("--actors", args.actors is not None),
        ("--actor-cpus", args.actor_cpus is not None),
        ("--actor-memory-mb", args.actor_memory_mb is not None),
    ):
        if given and args.ray is None:
            parser.error(f"{flag} needs --ray ADDRESS|local")
    for name in EXTRA:  # before the model opens: a missing one is one line, not a traceback later
        try:
            __import__(name)
        except ImportError:
            _say(f"the eval extra is not installed ({name} is missing): pip install 'bmoe[eval]'")
            return 1
    try:
        return _evaluate(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as e:  # a refusal, or a bug: one line either way, the traceback only with --debug
        if args.debug:
            import traceback

            traceback.print_exception(e)
        _say(str(e) if isinstance(e, BmoeError) else f"internal error: {type(e).__name__}: {e}")
        return 1


def _evaluate(args: argparse.Namespace) -> int:
    from bmoe.errors import ConfigError
    from bmoe.eval.dataset import load, shipped_set

    path = shipped_set(args.set) if args.set else args.data
    defaults = {
        k: v
        for k, v in (("abstain_below", args.abstain_below), ("scoring", args.scoring), ("debias", args.debias))
        if v is not None
    }
    ds = load(path, defaults)
    for line, why in ds.skipped:
        _say(f"{path} line {line} skipped: {why}")
    if not ds.rows:
        raise ConfigError(f"data: no usable row in {path}")
    pride = {r.line for r in ds.rows if r.request.debias == "pride"}
    if pride and args.ray is not None:
        raise ConfigError(
            f'--ray: {len(pride)} rows use "debias": "pride", whose prior a session estimates from '
            f'the first rows it answers; each Ray actor has its own session and gets the rows in '
            f'another order, so the figures would not be those of one process; run them without --ray'
        )
    if args.fit_temperature:
        n_calib = sum(r.split == args.calib_split for r in ds.rows)
        if n_calib == 0 or n_calib == len(ds.rows):
            raise ConfigError(
                f'--fit-temperature: {n_calib} of the {len(ds.rows)} rows have "split":"{args.calib_split}"; '
                f"it needs some to fit on and some to report on (mark the fitting rows with that split, or name "
                f"theirs with --calib-split)"
            )
    try:
        cfg = config_from_flags(args, model_from_flags(args, PROG), decide=True)
    except BmoeError as e:
        raise ConfigError(opening_failure(e)) from e
    from bmoe.eval.store import ResultStore, identity

    store = ResultStore(args.out)
    ident = identity(
        ds.sha256,
        cfg.model,
        chat=cfg.chat,
        flash_attn=cfg.flash_attn,
        kv_f32=cfg.kv_f32,
        abstain_below=args.abstain_below,
        scoring=args.scoring,
        debias=args.debias,
        decide_pride_sample=cfg.decide_pride_sample if pride else None,
    )
    try:
        return _run(args, ds, cfg, path, pride, store, ident)
    finally:
        store.unlock()


def _run(
    args: argparse.Namespace,
    ds: Dataset,
    cfg: SessionConfig,
    path: Path,
    pride: set[int],
    store: ResultStore,
    ident: dict,
) -> int:
    """Open the output folder (its lock held until the caller lets it go), answer what is left, write."""
    done = store.open(ident, {"data": str(path), "rows": len(ds.rows)}, OUTPUT_FILES)
    # a refused row is asked again: a refusal costs nothing, and it may have come from the
    # session's settings (scoring "full" with --decide-batch 1) rather than the row
    todo = [r for r in ds.rows if r.line not in done or "error" in done[r.line]]
    asked = {r.line for r in todo}
    if pride & asked:
        # pride's prior belongs to the session: this one answers every pride row again, in the
        # order a fresh run sends them, so that the figures are a fresh run's (docs/eval.md#resume)
        first: dict[str, int] = {}
        for r in ds.rows:
            first.setdefault(r.request.prefix, r.line)
        again = pride | asked
        todo = sorted((r for r in ds.rows if r.line in again), key=lambda r: first[r.request.prefix])
    if done:
        _say(f"resuming: {len(ds.rows) - len(todo)} of {len(ds.rows)} rows are already in {store.results}")
    try:
        counts = _answer(args, cfg, store, todo, done)
    finally:
        store.close()
    ordered = [done[r.line] for r in ds.rows if r.line in done]
    store.finish(ordered)
    return _write_outputs(args, ds, cfg.model, path, ordered, len(ds.rows) - len(todo), counts)


def _answer(
    args: argparse.Namespace, cfg: SessionConfig, store: ResultStore, todo: list[Row], done: dict[int, dict]
) -> RunCounts:
    """Answer ``todo`` through one session, storing each answer as it comes; ``done`` gains them."""
    from tqdm import tqdm

    from bmoe.eval.runner import RunCounts, chunks, result_row, run
    from bmoe.eval.store import OutputError

    counts = RunCounts()
    if not todo:
        return counts
    if args.ray is not None:
        return _answer_on_ray(args, cfg, store, todo, done, counts)
    try:
        from bmoe.session import Session

        session = Session(cfg)
    except Exception as e:
        from bmoe.errors import ConfigError

        raise ConfigError(opening_failure(e)) from e
    size = args.batch or cfg.batch_width
    bar = tqdm(total=len(todo), unit="dec", desc=PROG, file=sys.stderr, dynamic_ncols=True)

    def on_result(row, result) -> None:
        if result.error is not None:
            bar.write(
                f"{PROG}: line {row.line} {'refused' if result.refused else 'failed'}: {result.error}", file=sys.stderr
            )
            if not result.refused:  # not stored: a rerun tries it again
                bar.update(1)
                return
        out = result_row(row, result)
        store.append(out)
        done[row.line] = out
        bar.set_postfix(kept_hits=counts.kept_hits, refresh=False)
        bar.update(1)

    saved = f"rerun the same command to resume (answered rows are in {store.results})"
    try:
        with session:
            run(session, chunks(todo, size), on_result, counts)
    except KeyboardInterrupt:
        bar.close()
        _say(f"interrupted after {counts.decided} decisions this run; {saved}")
        raise
    except OutputError:  # says itself where the answered rows are
        raise
    except BmoeError as e:
        raise BmoeError(f"{e}; {saved}") from e
    finally:  # before any message: a line printed over the bar would share its line
        bar.close()
    return counts


def _answer_on_ray(
    args: argparse.Namespace,
    cfg: SessionConfig,
    store: ResultStore,
    todo: list[Row],
    done: dict[int, dict],
    counts: RunCounts,
) -> RunCounts:
    """``_answer`` on a Ray actor pool: each answer is stored as its batch comes back (any order), so
    an interruption keeps what came back. Refused and failed rows are told apart as in one
    process: a failed one (``"failed": true``) is named and not stored, so a rerun tries it again."""
    from tqdm import tqdm

    from bmoe.errors import ConfigError
    from bmoe.eval.runner import answer_row, run_ray
    from bmoe.eval.store import OutputError
    from bmoe.ray.data import RayOptions

    saved = f"rerun the same command to resume (answered rows are in {store.results})"
    options = RayOptions(
        address=args.ray,
        actors=args.actors or 1,
        batch_rows=args.batch or max(cfg.batch_width, RAY_BATCH_ROWS),
        num_cpus=args.actor_cpus or 1.0,
        memory_mb=args.actor_memory_mb,
    )
    bar = tqdm(total=len(todo), unit="dec", desc=PROG, file=sys.stderr, dynamic_ncols=True)

    def on_answer(row: Row, answer: dict) -> None:
        if "error" in answer:
            failed = answer.get("failed", False)
            bar.write(
                f"{PROG}: line {row.line} {'failed' if failed else 'refused'}: {answer['error']}", file=sys.stderr
            )
            if failed:
                bar.update(1)
                return
        out = answer_row(row, answer)
        store.append(out)
        done[row.line] = out
        bar.set_postfix(kept_hits=counts.kept_hits, refresh=False)
        bar.update(1)

    try:
        try:
            run_ray(todo, cfg, options, on_answer, counts)
        finally:
            bar.close()
    except KeyboardInterrupt:
        _say(f"interrupted after {counts.decided} decisions this run; {saved}")
        raise
    except (ConfigError, OutputError):  # a setting refused before anything was sent; a full disk
        raise
    except ImportError as e:  # the ray extra missing: nothing was sent either
        raise ConfigError(run_failure(e)) from e
    except Exception as e:  # rows lost; Ray's own failure (every retry spent, the cluster gone): one line
        raise BmoeError(f"{e if isinstance(e, BmoeError) else run_failure(e)}; {saved}") from e
    return counts


def _write_outputs(
    args: argparse.Namespace, ds: Dataset, model: Path, path: Path, ordered: list[dict], resumed: int, counts: RunCounts
) -> int:
    from bmoe.eval import plots
    from bmoe.eval.metrics import curves
    from bmoe.eval.report import compute, markdown, scored
    from bmoe.eval.store import RESULTS, writing

    refused = [{"line": r["line"], "error": r["error"]} for r in ordered if "error" in r]
    answered = [r for r in ordered if "error" not in r]
    missing = len(ds.rows) - len(ordered)
    if not answered:
        _say(f"no row was answered ({len(refused)} refused, {missing} failed); no metrics written")
        return 1
    doc: dict = {
        "data": str(path),
        "data_sha256": ds.sha256,
        "model": str(model),
        "rows": len(ds.rows),
        "answered": len(answered),
        "unanswered": missing,
        "skipped_lines": [{"line": n, "why": why} for n, why in ds.skipped],
        "refused": refused,
    }
    doc.update(
        compute(answered, fit=args.fit_temperature, calib_split=args.calib_split, abstain_below=args.abstain_below)
    )
    doc["run"] = {
        "decided": counts.decided,
        "resumed": resumed,
        "seconds": round(counts.seconds, 3),
        "decisions_per_s": round(counts.per_s, 3),
        "batches": len(counts.batch_ids),
        "kept_state_hits": sum(r["n_reused"] > 0 for r in answered),
    }
    out = args.out
    results = out / RESULTS  # a full disk names the file that failed, and where the answers are
    with writing(out / "metrics.json", results):
        (out / "metrics.json").write_text(json.dumps(doc, indent=1) + "\n")
    report = markdown(doc)
    with writing(out / "report.md", results):
        (out / "report.md").write_text(report)
    t = doc["temperature"]
    fitted = t is not None and "after" in t
    evaluated = [r for r in answered if not fitted or r.get("split") != args.calib_split]
    title = f"{path.name} on {model.name}"
    series = [("T = 1", doc["metrics"]["ece_bins"])]
    if fitted:
        series.append((f"T = {t['temperature']:.3f}", t["after"]["ece_bins"]))
    with writing(out / "reliability.png", results):
        plots.reliability(out / "reliability.png", series, title)
    a = doc["abstention"]
    mark = (
        (a["abstain_below"], a["coverage"], a["accuracy_answered"])
        if a is not None and a["accuracy_answered"] is not None
        else None
    )
    with writing(out / "coverage.png", results):
        plots.coverage(out / "coverage.png", curves(scored(evaluated)), title, mark)
    print(report, end="")
    if missing:
        _say(f"{missing} rows failed and are not in the metrics; rerun the same command to retry them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
