"""reliability.png and coverage.png (matplotlib, drawn on Figure objects: no GUI backend, no pyplot
state)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from bmoe.eval.metrics import SELECTIVE_COVERAGE


def reliability(path: Path, series: list[tuple[str, list[dict]]], title: str) -> None:
    """Per series (a label and its ECE bins): accuracy per confidence bin against the diagonal, and
    how many rows each bin holds."""
    fig = Figure(figsize=(6.4, 6.0), dpi=100)
    ax, hist = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfectly calibrated")
    width = 1.0 / len(series[0][1]) / len(series)
    for k, (label, bins) in enumerate(series):
        lo = np.array([b["lo"] for b in bins])
        left = lo + k * width
        acc = [b["accuracy"] if b["n"] else 0.0 for b in bins]
        ax.bar(left, acc, width=width, align="edge", alpha=0.75, edgecolor="black", linewidth=0.5, label=label)
        hist.bar(left, [b["n"] for b in bins], width=width, align="edge", alpha=0.75, edgecolor="black", linewidth=0.5)
    ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy in bin", title=title)
    ax.legend(loc="upper left", fontsize="small")
    hist.set(xlabel="top probability over the choices (renormalised), 10 bins", ylabel="rows")
    fig.tight_layout()
    fig.savefig(path)


def coverage(
    path: Path, curves: dict[str, np.ndarray], title: str, abstain: tuple[float, float, float] | None = None
) -> None:
    """Accuracy of the rows answered against the share answered, answering the most confident
    first, ranked two ways; ``abstain`` = (threshold, coverage, accuracy) marks --abstain-below."""
    fig = Figure(figsize=(6.4, 4.8), dpi=100)
    ax = fig.subplots()
    ax.plot(curves["coverage"], curves["accuracy"], label="ranked by top probability over the choices")
    ax.plot(
        curves["raw_coverage"],
        curves["raw_accuracy"],
        linestyle="--",
        label="ranked by best choice's probability over the vocabulary",
    )
    ax.axvline(SELECTIVE_COVERAGE, color="grey", linewidth=0.8, linestyle=":")
    if abstain is not None:
        t, cov, acc = abstain
        ax.plot([cov], [acc], marker="o", color="black", linestyle="none", label=f"abstain_below {t:g}")
    ax.set(
        xlim=(0, 1.01),
        ylim=(0, 1.01),
        xlabel="coverage (share of rows answered)",
        ylabel="accuracy of the answered rows",
        title=title,
    )
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
