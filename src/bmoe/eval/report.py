"""metrics.json and report.md from the result rows (docs/eval.md#output)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bmoe.eval import metrics as m
from bmoe.eval.temperature import fit_temperature

PROBABILITIES = (
    "the choices' probabilities renormalised to sum 1 (softmax of choice_logp, or of the score "
    "best_by names, or a debiased row's debiased_p; divided by T when a temperature is applied); "
    "p_outside, the mass outside the choices, is reported on its own"
)
TINY = 1e-300  # a debiased probability's floor before its log
# best_by (a BMOE_DECIDE key under scoring "full") -> the BMOE_DECIDE key of the score it ranks by
SCORE_KEYS = {
    "sum": "choice_logp",
    "mean": "choice_logp_mean",
    "norm": "choice_logp_norm",
    "uncond": "choice_logp_uncond",
}


def score_key(result: dict) -> str:
    """The key of the scores a result picked its best by: choice_logp unless best_by names another."""
    return SCORE_KEYS.get(result.get("best_by", "sum"), "choice_logp")


def _logp(result: dict, raw: bool) -> tuple[float, ...]:
    """The scores a row is evaluated by: its debiased probabilities (as logs) when it was debiased,
    unless ``raw``; else the scores its best_by names."""
    if not raw and result.get("debiased_p") is not None:
        return tuple(math.log(max(p, TINY)) for p in result["debiased_p"])
    return tuple(result[score_key(result)])


def _p_best(result: dict, raw: bool) -> float:
    """The probability decide's abstain_below compares: a debiased row's debiased_p of its best
    option, unless ``raw``; else exp(choice_logp) of the choice its best_by score ranks first."""
    if not raw and result.get("debiased_p") is not None:
        return max(result["debiased_p"])
    return math.exp(result["choice_logp"][int(np.argmax(result[score_key(result)]))])


def scored(results: Sequence[dict], raw: bool = False) -> list[m.Scored]:
    return [
        m.Scored(
            logp=_logp(r, raw),
            gold=r["gold"],
            p_outside=r["p_outside"],
            abstained=bool(r.get("abstained", False)) and not raw,
            p_best=_p_best(r, raw),
        )
        for r in results
    ]


def accuracy_by(results: Sequence[dict]) -> dict[str, float]:
    """Accuracy by every ranking rule whose scores all the rows carry (under scoring "full": sum,
    mean, norm and uncond, as lm-eval's acc and acc_norm are sum and norm)."""
    out = {}
    for rule, key in SCORE_KEYS.items():
        if results and all(r.get(key) is not None for r in results):
            out[rule] = sum(int(np.argmax(r[key])) == r["gold"] for r in results) / len(results)
    return out


def positions(rows: Sequence[m.Scored]) -> dict[str, list[int]]:
    """How often each choice position (0 = the first) was picked (argmax) and was the gold one: a
    model that always picks the first shows here, whatever its accuracy."""
    width = max(len(r.logp) for r in rows)
    picked, gold = [0] * width, [0] * width
    for r in rows:
        picked[int(np.argmax(r.logp))] += 1
        gold[r.gold] += 1
    return {"picked": picked, "gold": gold}


def compute(answered: Sequence[dict], *, fit: bool, calib_split: str, abstain_below: float | None) -> dict:
    """The figures of metrics.json over answered rows (no "error" key). With ``fit``, T is fitted on
    the rows of ``calib_split`` and every figure is over the other rows, before and after T."""
    out: dict = {"probabilities": PROBABILITIES, "evaluated": "all answered rows", "temperature": None}
    rows = list(answered)
    if fit:
        calib = [r for r in answered if r.get("split") == calib_split]
        rows = [r for r in answered if r.get("split") != calib_split]
        out["evaluated"] = f'answered rows whose split is not "{calib_split}"'
        if calib and rows:
            fitted = fit_temperature(scored(calib))
            out["temperature"] = {
                **fitted.as_dict(),
                "calib_split": calib_split,
                "after": m.summary(scored(rows), fitted.temperature),
            }
        else:
            out["temperature"] = {
                "error": f'no temperature fitted: {len(calib)} answered rows in split '
                f'"{calib_split}" and {len(rows)} outside it (both must be > 0)'
            }
            rows = list(answered)
            out["evaluated"] = "all answered rows"
    if not rows:
        raise ValueError("no answered rows to evaluate")
    s = scored(rows)
    out["metrics"] = m.summary(s)
    out["accuracy_by"] = accuracy_by(rows)
    out["positions"] = positions(s)
    # debiased rows: the same figures before debiasing, from choice_logp (the options in their given order)
    debiased = [r for r in rows if r.get("debiased_p") is not None]
    out["raw"] = (
        None
        if not debiased
        else {
            "n_debiased": len(debiased),
            "metrics": m.summary(scored(rows, raw=True)),
            "positions": positions(scored(rows, raw=True)),
        }
    )
    thresholds = sorted(set(m.TRADEOFF_THRESHOLDS) | ({abstain_below} if abstain_below is not None else set()))
    out["tradeoff"] = m.tradeoff(s, thresholds)
    out["abstention"] = {"abstain_below": abstain_below, **m.abstention(s)} if abstain_below is not None else None
    return out


def _f(x: float | None, nd: int = 4) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _metric_row(label: str, s: dict) -> str:
    return (
        f"| {label} | {s['n']} | {_f(s['accuracy'])} | {_f(s['nll'])} | {_f(s['brier'])} | {_f(s['ece'])} "
        f"| {_f(s['aurc'])} | {_f(s['selective_accuracy_80'])} | {_f(s['mean_confidence'])} |"
    )


def markdown(doc: dict) -> str:
    """report.md: the figures of metrics.json for people."""
    fig = doc["metrics"]
    lines = [
        f"# bmoe-eval: {Path(doc['data']).name}",
        "",
        f"Model `{Path(doc['model']).name}`, data `{doc['data']}` (sha256 {doc['data_sha256'][:12]}): "
        f"{doc['answered']} rows answered, {len(doc['refused'])} refused, {len(doc['skipped_lines'])} lines skipped.",
        f"Probabilities: {doc['probabilities']}. Evaluated: {doc['evaluated']}.",
        "",
        "| temperature | rows | accuracy | NLL | Brier | ECE (10 bins) | AURC | sel. acc. @80% | mean top p |",
        "|---|---|---|---|---|---|---|---|---|",
        _metric_row("T = 1", fig),
    ]
    t = doc["temperature"]
    if t is not None and "after" in t:
        lines.append(_metric_row(f"T = {t['temperature']:.3f}", t["after"]))
        bound = " (on a bound of the search: a limit, not a minimum)" if t["at_bound"] else ""
        lines += [
            "",
            f"T = {t['temperature']:.3f}{bound}, fitted on {t['calib_n']} rows of split "
            f"\"{t['calib_split']}\" (their NLL {_f(t['calib_nll_before'])} -> {_f(t['calib_nll_after'])}).",
        ]
    elif t is not None:
        lines += ["", f"Temperature: {t['error']}."]
    if len(doc.get("accuracy_by", {})) > 1:
        lines += [
            "",
            "Accuracy by ranking rule: " + ", ".join(f"{k} {_f(v)}" for k, v in doc["accuracy_by"].items()) + ".",
        ]
    pos = doc["positions"]
    lines += [
        "",
        "Choice positions (first, second, ...): picked "
        + " / ".join(map(str, pos["picked"]))
        + ", gold "
        + " / ".join(map(str, pos["gold"]))
        + ".",
    ]
    raw = doc.get("raw")
    if raw is not None:
        r = raw["metrics"]
        lines += [
            "",
            f"Debiased rows: {raw['n_debiased']}; the figures above use their debiased_p. Before "
            f"debiasing (choice_logp, T = 1): accuracy {_f(r['accuracy'])}, NLL {_f(r['nll'])}, Brier "
            f"{_f(r['brier'])}, ECE {_f(r['ece'])}; picked " + " / ".join(map(str, raw["positions"]["picked"])) + ".",
        ]
    q = fig["p_outside"]
    lines += [
        "",
        "p_outside (mass outside the choices): "
        + ", ".join(
            f"{k.replace('q0', 'min').replace('q100', 'max').replace('q50', 'median')} {_f(v)}" for k, v in q.items()
        )
        + ".",
    ]
    whose = " (a debiased row's: its debiased_p of the best option)" if raw is not None else ""
    lines += [
        "",
        "Abstaining when the best choice's probability over the whole vocabulary is under a threshold "
        f"(decide's `abstain_below` rule){whose}:",
        "",
        "| threshold | coverage | accuracy of the answered |",
        "|---|---|---|",
    ]
    lines += [f"| {r['threshold']:g} | {_f(r['coverage'], 3)} | {_f(r['accuracy'], 3)} |" for r in doc["tradeoff"]]
    a = doc["abstention"]
    if a is not None:
        lines += [
            "",
            f"With `abstain_below` {a['abstain_below']:g} the session abstained on {a['n_abstained']} rows: "
            f"coverage {_f(a['coverage'], 3)}, accuracy of the answered {_f(a['accuracy_answered'], 3)}.",
        ]
    run = doc["run"]
    lines += [
        "",
        f"Run: {run['decided']} decisions in {run['seconds']:.1f} s ({run['decisions_per_s']:.2f}/s), "
        f"{run['resumed']} resumed from an earlier run; kept-state hits (n_reused > 0) "
        f"{run['kept_state_hits']} of {doc['answered']}; {run['batches']} batches prefilled together.",
    ]
    return "\n".join(lines) + "\n"
