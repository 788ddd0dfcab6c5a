"""The plots of docs/benchmarks.md, each drawn from the latest records that hold its data.

bench/render.py asks each plot whether its data exists (no matplotlib needed for that, so the
page renders and its drift test runs without it) and draws the PNGs under docs/img/bench/.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Records = dict[str, list[dict]]  # bench -> its records, oldest first


@dataclass(frozen=True)
class Plot:
    name: str  # file under docs/img/bench/
    caption: str
    bench: str  # the section it shows in
    has_data: Callable[[Records], bool]
    draw: Callable[[Records, Path], None]
    # the tables of its source record whose every figure the plot draws: the page leaves them out
    covers: Callable[[dict], bool] | None = None
    source_of: Callable[[Records], dict | None] | None = None  # the record it draws (default: the latest full)

    def source(self, by: Records) -> dict | None:
        return self.source_of(by) if self.source_of else latest(by, self.bench)


def latest(by: Records, bench: str, full: bool = True) -> dict | None:
    recs = [r for r in by.get(bench, []) if not (full and r.get("partial"))]
    return recs[-1] if recs else None


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "svg.hashsalt": "bmoe", "figure.dpi": 100})
    return plt


def _save(fig, path: Path) -> None:  # type: ignore[no-untyped-def]
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})


def _rows(rec: dict, title_start: str) -> list[dict]:
    t = next((t for t in rec["tables"] if str(t["title"]).startswith(title_start)), None)
    return list(t["rows"]) if t else []


# --- decode under a limit --------------------------------------------------------------------
def _stream_ok(by: Records) -> bool:
    rec = latest(by, "stream")
    return bool(rec and any(isinstance(r.get("decode_tok_s"), (int, float)) for r in rec["tables"][0]["rows"]))


def _stream(by: Records, path: Path) -> None:
    plt = _pyplot()
    rec = latest(by, "stream")
    assert rec
    rows = [r for r in rec["tables"][0]["rows"] if isinstance(r.get("decode_tok_s"), (int, float))]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    names = [r["name"] for r in rows]
    vals = [r["decode_tok_s"] for r in rows]
    colors = ["#888888" if n.startswith("llama") else "#2a6fb0" for n in names]
    ax.barh(range(len(rows)), vals, color=colors)
    ax.set_yticks(range(len(rows)), names)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("decode tokens/s (log scale)")
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=8)
    ax.set_title(f"Decode, 2.5 GiB limit and warm ({rec['date'][:10]}, {rec['machine']['cpu']})", fontsize=9)
    _save(fig, path)
    plt.close(fig)


# --- decisions per configuration -------------------------------------------------------------
def _ds_ok(by: Records) -> bool:
    rec = latest(by, "decide_stream")
    return bool(rec and len(rec["tables"]) >= 2)


def _ds(by: Records, path: Path) -> None:
    plt = _pyplot()
    rec = latest(by, "decide_stream")
    assert rec
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), sharex=True)
    for ax, t in zip(axes, rec["tables"][:2]):
        rows = [r for r in t["rows"] if isinstance(r.get("latency_s"), (int, float))]
        vals = [r["latency_s"] for r in rows]
        colors = [
            "#888888"
            if r["name"].startswith("llama")
            else "#555555"
            if "resident" in r["name"]
            else "#c05030"
            if ("LRU" in r["name"] or "page moves" in r["name"])
            else "#2a6fb0"
            for r in rows
        ]
        ax.barh(range(len(rows)), vals, color=colors)
        ax.set_yticks(range(len(rows)), [r["name"].removeprefix("bmoe ") for r in rows], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(str(t["title"]).split(" ")[0], fontsize=9)
        ax.set_xlabel("median decision latency, s")
    fig.suptitle(f"Decisions under a 2.5 GiB limit ({rec['date'][:10]})", fontsize=9)
    _save(fig, path)
    plt.close(fig)


# --- the plan against the memory limit -------------------------------------------------------
def _limit_label(r: dict) -> str:
    return "none" if r.get("limit_gib") is None else f"{r['limit_gib']:g} GiB"


def _plan_ok(by: Records) -> bool:
    rec = latest(by, "plan")
    return bool(rec and rec["tables"] and "planned_s" in rec["tables"][0]["rows"][0])


def _plan_with_llama(by: Records) -> dict | None:
    """The latest plan record whose rows hold llama.cpp mmap's figures (a run with --grid llama,
    partial or not), else the latest full one: the three lines of a plot come from one run."""
    for rec in reversed(by.get("plan", [])):
        if any(isinstance(r.get("llama_s"), (int, float)) for t in rec["tables"] for r in t["rows"]):
            return rec
    return latest(by, "plan")


def _plan_speed(by: Records, path: Path) -> None:
    plt = _pyplot()
    rec = _plan_with_llama(by)
    assert rec
    fig, axes = plt.subplots(2, len(rec["tables"]), figsize=(9, 5.6), squeeze=False)
    for col, t in enumerate(rec["tables"]):
        rows = t["rows"]
        x = range(len(rows))
        preset = str(t["title"]).split(":")[0]
        for row_i, (mine, theirs, llama, label) in enumerate(
            (
                ("planned_s", "best_grid_s", "llama_s", "decision latency, s"),
                ("planned_tok_s", "best_grid_tok_s", "llama_tok_s", "decode tok/s"),
            )
        ):
            ax = axes[row_i][col]
            ax.plot(x, [r[mine] for r in rows], "o-", color="#2a6fb0", label="the plan")
            ax.plot(x, [r[theirs] for r in rows], "s--", color="#888888", label="best hand-picked of the grid")
            if any(isinstance(r.get(llama), (int, float)) for r in rows):
                ax.plot(x, [r.get(llama) for r in rows], "^:", color="#c05030", label="llama.cpp mmap")
            ax.set_xticks(list(x), [_limit_label(r) for r in rows])
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0)
            if row_i == 0:
                ax.set_title(f"{preset} preset", fontsize=9)
            else:
                ax.set_xlabel("memory limit")
            ax.legend(fontsize=7, loc="lower right" if row_i else "lower left")
    fig.suptitle(
        f"The plan, the grid's best and llama.cpp mmap, by memory limit ({rec['date'][:10]}, {rec['machine'].get('cpu')})",
        fontsize=9,
    )
    _save(fig, path)
    plt.close(fig)


def _plan_choices(by: Records, path: Path) -> None:
    plt = _pyplot()
    rec = latest(by, "plan")
    assert rec
    fig, ax = plt.subplots(figsize=(7, 3.2))
    width = 0.8 / len(rec["tables"])
    for i, t in enumerate(rec["tables"]):
        rows = t["rows"]
        preset = str(t["title"]).split(":")[0]
        xs = [j + i * width for j in range(len(rows))]
        vals = [r["cache_mib"] or 0 for r in rows]
        ax.bar(xs, vals, width, label=f"{preset}: expert cache MiB", color=("#2a6fb0", "#6fa8dc")[i % 2])
        for x, r, v in zip(xs, rows, vals):
            tag = (
                "resident"
                if r["mode"] == "resident"
                else f"{v} MiB" + (" +ra" if r["readahead"] else "") + f" ub{r['ubatch']}"
            )
            ax.text(
                x,
                v + 40 if r["mode"] == "resident" else v / 2,
                tag,
                ha="center",
                va="bottom" if r["mode"] == "resident" else "center",
                fontsize=7,
                rotation=90,
            )
        ax.set_xticks(
            [j + width * (len(rec["tables"]) - 1) / 2 for j in range(len(rows))], [_limit_label(r) for r in rows]
        )
    ax.set_xlabel("memory limit")
    ax.set_ylabel("cache MiB (0 when resident)")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("What the plan chose (+ra: read-ahead; ub: ubatch)", fontsize=9)
    _save(fig, path)
    plt.close(fig)


# --- cache replay ----------------------------------------------------------------------------
def _replay_ok(by: Records) -> bool:
    rec = latest(by, "cache_replay")
    return bool(rec and any("budget_mib" in (t["rows"] or [{}])[0] for t in rec["tables"]))


def _replay(by: Records, path: Path) -> None:
    plt = _pyplot()
    rec = latest(by, "cache_replay")
    assert rec
    tables = [t for t in rec["tables"] if t["rows"] and "budget_mib" in t["rows"][0]]
    fig, axes = plt.subplots(1, len(tables), figsize=(11, 3.6), squeeze=False)
    styles = (
        ("held_out", "bmoe's policy", "o-", "#2a6fb0"),
        ("lru", "global LRU", "s--", "#888888"),
        ("partition", "in-budget LFU partition", "^--", "#c05030"),
        ("optimal", "optimum (Belady)", ":", "#333333"),
    )
    for ax, t in zip(axes[0], tables):
        b = [r["budget_mib"] for r in t["rows"]]
        for key, label, style, color in styles:
            ax.plot(b, [r[key] for r in t["rows"]], style, color=color, label=label, markersize=4)
        ax.set_title(str(t["title"]).split(" (")[0], fontsize=9)
        ax.set_xlabel("cache budget, MiB")
        ax.set_ylim(0, 100)
    axes[0][0].set_ylabel("decode hit %")
    axes[0][0].legend(fontsize=7, loc="upper left")
    _save(fig, path)
    plt.close(fig)


# --- batched decisions -----------------------------------------------------------------------
from bench_records import SIZES_TITLE  # noqa: E402


def _sizes(by: Records) -> tuple[dict, list[dict]] | None:
    """The latest decide_batch record with a batch-size sweep (a partial run), and its rows."""
    for rec in reversed(by.get("decide_batch", [])):
        rows = _rows(rec, SIZES_TITLE)
        if len(rows) > 2:
            return rec, rows
    return None


def _batch_ok(by: Records) -> bool:
    return _sizes(by) is not None


def _batch(by: Records, path: Path) -> None:
    plt = _pyplot()
    found = _sizes(by)
    assert found
    rec, rows = found
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.4))
    ks = [r["batch"] for r in rows]
    st = [(r["batch"], r["streamed_s"]) for r in rows if isinstance(r.get("streamed_s"), (int, float))]
    if st:
        ax.plot(*zip(*st), "o-", color="#2a6fb0", label="streamed, cache off, 2.5 GiB limit")
    rs = [r for r in rows if isinstance(r.get("resident_s"), (int, float))]
    if rs:
        ax.errorbar(
            [r["batch"] for r in rs],
            [r["resident_s"] for r in rs],
            yerr=[r["resident_s"] * r["resident_spread"] / 2 for r in rs],
            fmt="s--",
            color="#888888",
            capsize=3,
            label="resident SmolLM2 (bars: its rounds' spread)",
        )
    rd = [(r["batch"], r["read_mib"]) for r in rows if isinstance(r.get("read_mib"), (int, float))]
    if rd:
        bx.plot(*zip(*rd), "o-", color="#c05030")
    for a_, label in ((ax, "seconds per decision"), (bx, "expert MiB read per decision (streamed)")):
        a_.set_xscale("log", base=2)
        a_.set_xticks(ks, [str(k) for k in ks])
        a_.set_xlabel("decisions per batch (1: one by one)")
        a_.set_ylabel(label)
        a_.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    fig.suptitle(f"Batched decisions by batch size ({rec['date'][:10]}, {rec['machine'].get('cpu')})", fontsize=9)
    _save(fig, path)
    plt.close(fig)


PLOTS = (
    Plot("stream.png", "decode tokens/s per run, under the limit and warm", "stream", _stream_ok, _stream),
    Plot("decide-stream.png", "median decision latency per configuration, both presets", "decide_stream", _ds_ok, _ds),
    Plot(
        "plan-speed.png",
        "decision latency and decode rate by memory limit: the plan, the grid's best, llama.cpp mmap",
        "plan",
        _plan_ok,
        _plan_speed,
        source_of=lambda by: _plan_with_llama(by),
    ),
    Plot("plan-choices.png", "what the plan chose at each memory limit", "plan", _plan_ok, _plan_choices),
    Plot(
        "cache-replay.png",
        "decode hit rate against the cache budget, per trace",
        "cache_replay",
        _replay_ok,
        _replay,
        covers=lambda t: bool(t["rows"]) and "budget_mib" in t["rows"][0],
    ),
    Plot(
        "decide-batch.png",
        "seconds per decision and bytes read, by batch size",
        "decide_batch",
        _batch_ok,
        _batch,
        source_of=lambda by: (_sizes(by) or (None,))[0],
    ),
)
