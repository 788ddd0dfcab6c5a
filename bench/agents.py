"""Benchmark: four agents taking turns on one server, each restoring its own state (issue #37.6).

Each agent is a chat: a system message holding its history (about ``--start-tokens`` tokens), then
one user message a step (about ``--grow-tokens`` tokens: the screen and its options) and the model's
short answer. ``--agents`` agents take ``--steps`` steps each, round robin, on one server; the same
server kind then runs one agent alone for ``--steps`` steps (a fresh process, page cache dropped),
the baseline. Servers, each in its own memory cgroup (``--limit-gib``; 0: none):

* bmoe-server with the state store (``--state-ram-mib``, ``--state-disk-mib``);
* llama-cpp-python's own server (``python -m llama_cpp.server``) with its prompt cache in RAM, and
  on disk: what a user tries first. It needs the package's ``server`` extra (sse-starlette,
  starlette-context, pydantic-settings) and, for the disk cache, diskcache; ``--extras DIR`` puts a
  folder holding them on its path. Skipped, with a note, when they cannot be imported.

Per step: the client's wall time, prompt and cached tokens. The target: the median step after
each agent's first, interleaved, within 1.2x of the same alone. Also: bytes the server read from
storage (/proc/PID/io read_bytes, experts and state files alike) and, for bmoe, the store's bytes
per tier (/metrics); for llama-cpp-python's disk cache, its folder's size.

    sudo .venv/bin/python bench/agents.py [--model PATH | --model tiny:qwen3moe] [--limit-gib 2.5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import record  # noqa: E402
from cgroup_run import CgroupError, drop_caches, own_memory_cgroup  # noqa: E402

BENCH_MODEL = Path.home() / ".cache" / "bmoe" / "bench" / "synthetic-qwen3moe-16L-q4_0.gguf"
TARGET = 1.2
_WORDS = (
    "opened Settings scrolled down tapped Network went back searched Display Battery Sound Apps Storage "
    "Bluetooth Hotspot Privacy Location Security saw a dialog closed the banner waited for the list"
).split()


# llama-cpp-python's server, with the repacked ("extra") CPU weight buffers off, as bmoe loads: as
# shipped, its first decode died of SIGILL on the bench machine (AMX kernels on a VM).
LLAMA_SERVER = """
import llama_cpp.llama_cpp as c
default = c.llama_model_default_params
def params():
    p = default()
    p.use_extra_bufts = False
    return p
c.llama_model_default_params = params
from llama_cpp.server.__main__ import main
main()
"""


def words(seed: int, n: int) -> str:
    """``n`` deterministic words of agent ``seed``'s history (about one token a word)."""
    return " ".join(_WORDS[(seed * 7 + i * 13 + i // 5) % len(_WORDS)] for i in range(n))


def conversation(agent: int, start_tokens: int) -> list[dict]:
    task = ("turn on Wi-Fi", "call Mom on speaker", "set an alarm for seven", "share the last photo")[agent % 4]
    system = f"You control a phone for the user. Task {agent}: {task}. History: {words(agent, start_tokens)}"
    return [{"role": "system", "content": system}]


def step_message(agent: int, step: int, grow_tokens: int) -> dict:
    body = words(agent * 31 + step, max(1, grow_tokens - 20))
    return {"role": "user", "content": f"Step {step}. Screen: {body}. Options: A) next B) back C) home. Answer:"}


@dataclass
class Server:
    name: str
    proc: subprocess.Popen
    cgroup: Path | None
    port: int
    log: Path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def start(name: str, cmd: list[str], a: argparse.Namespace, port: int, *, env=None, cwd=None) -> Server:
    cg = None
    if a.limit_gib:
        cg = own_memory_cgroup() / f"bmoe-agents-{os.getpid()}-{name}"
        cg.mkdir()
        (cg / "memory.limit_in_bytes").write_text(str(int(a.limit_gib * 2**30)))
    procs = cg / "cgroup.procs" if cg is not None else None

    def enter() -> None:
        if procs is not None:
            procs.write_text(str(os.getpid()))

    if a.cold:
        drop_caches()
    log = a.work / f"{name}.log"
    p = subprocess.Popen(cmd, preexec_fn=enter, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=cwd)
    return Server(name, p, cg, port, log)


def wait_ready(s: Server, client, timeout_s: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if s.proc.poll() is not None:
            raise RuntimeError(f"{s.name} exited ({s.proc.returncode}): {s.log.read_text()[-1500:]}")
        try:
            if client.get(s.url("/v1/models"), timeout=5).status_code == 200:
                return
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{s.name} not ready in {timeout_s} s")


def read_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def stop(s: Server) -> dict[str, object]:
    s.proc.terminate()
    try:
        s.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        s.proc.kill()
        s.proc.wait()
    out: dict[str, object] = {}
    if s.cgroup is not None:
        out["peak_mib"] = round(int((s.cgroup / "memory.max_usage_in_bytes").read_text()) / 2**20)
        oom = (s.cgroup / "memory.oom_control").read_text()
        out["oom_kills"] = int(re.search(r"oom_kill (\d+)", oom).group(1)) if "oom_kill " in oom else 0  # type: ignore[union-attr]
        try:
            s.cgroup.rmdir()
        except OSError:
            pass
    return out


@dataclass
class Phase:
    steps: list[dict] = field(default_factory=list)  # one per request: agent, step, wall_s, tokens
    read_mib: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)


def run_phase(s: Server, client, agents: list[int], a: argparse.Namespace, ph: Phase) -> None:
    """Fill ``ph`` step by step (the steps done stay when a later one fails)."""
    convs = {k: conversation(k, a.start_tokens) for k in agents}
    r0 = read_bytes(s.proc.pid)
    for step in range(a.steps):
        for k in agents:
            convs[k].append(step_message(k, step, a.grow_tokens))
            body = {"model": "m", "messages": convs[k], "max_tokens": a.max_tokens, "temperature": 0}
            t0 = time.perf_counter()
            r = client.post(s.url("/v1/chat/completions"), json=body, timeout=a.step_timeout)
            wall = time.perf_counter() - t0
            r.raise_for_status()
            j = r.json()
            usage = j.get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            ph.steps.append(
                {"agent": k, "step": step, "wall_s": wall, "prompt": usage.get("prompt_tokens"), "cached": cached}
            )
            convs[k].append({"role": "assistant", "content": j["choices"][0]["message"]["content"] or ""})
            print(
                f"  {s.name} agent {k} step {step}: {wall:.2f} s, prompt {usage.get('prompt_tokens')}, cached {cached}",
                file=sys.stderr,
            )
        ph.read_mib = (read_bytes(s.proc.pid) - r0) / 2**20


def store_figures(s: Server, client) -> dict[str, object]:
    """bmoe's store per tier, from /metrics."""
    text = client.get(s.url("/metrics"), timeout=10).text
    out: dict[str, object] = {}
    for m in re.finditer(r'^bmoe_state_store_(\w+)\{tier="(\w+)"\} (\S+)$', text, re.M):
        out[f"{m.group(1)}_{m.group(2)}"] = float(m.group(3))
    return out


def engines(a: argparse.Namespace) -> dict[str, tuple[list[str], dict | None, Path | None]]:
    py, m = sys.executable, str(a.model_path)
    bmoe = [py, "-m", "bmoe.server.main", "-m", m, "--chatml", "-c", str(a.n_ctx), "-t", str(a.threads)]
    bmoe += ["--decide", "--state-ram-mib", str(a.state_ram_mib), "--state-disk-mib", str(a.state_disk_mib)]
    bmoe += ["--state-dir", str(a.work / "states"), "-n", str(a.max_tokens)]
    out: dict[str, tuple[list[str], dict | None, Path | None]] = {"bmoe": (bmoe, None, None)}
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(a.extras or ""), os.environ.get("PYTHONPATH")]))
    )
    ok = subprocess.run([py, "-c", "import llama_cpp.server.app, diskcache"], env=env, capture_output=True, text=True)
    if ok.returncode != 0:
        a.notes.append(f"llama-cpp-python's server skipped: {ok.stderr.strip().splitlines()[-1]}")
        return out
    llama = [
        py,
        "-c",
        LLAMA_SERVER,
        "--verbose",
        "false",
        "--model",
        m,
        "--n_ctx",
        str(a.n_ctx),
        "--n_threads",
        str(a.threads),
    ]
    llama += ["--n_threads_batch", str(a.threads), "--chat_format", "chatml", "--cache", "true"]
    # Its default logits_all keeps n_ctx rows of logits (2 x 1.2 GB at a 151936 vocabulary): as
    # shipped it was OOM-killed at load under 2.5 GiB. A chat answer needs the last row only.
    # And its default use_mlock pins the whole mapped model in RAM: more than the limit.
    llama += ["--logits_all", "false", "--use_mlock", "false"]
    for kind in ("ram", "disk"):
        folder = a.work / f"llama-{kind}"
        folder.mkdir(parents=True, exist_ok=True)
        cmd = llama + ["--cache_type", kind, "--cache_size", str(a.llama_cache_mib * 2**20)]
        out[f"llama-cpp-python {kind}"] = (cmd, env, folder)
    return out


def median_after_first(ph: Phase) -> float | None:
    walls = [r["wall_s"] for r in ph.steps if r["step"] > 0]
    return statistics.median(walls) if walls else None


def run(a: argparse.Namespace) -> dict[str, object]:
    import httpx

    client = httpx.Client()
    report: dict[str, object] = {}
    port, t_start = a.port, time.monotonic()
    for name, (cmd, env, cwd) in engines(a).items():
        if a.engines and not any(name.startswith(e) for e in a.engines):
            continue
        report[name] = {}
        for phase, agents in (("alone", [0]), ("interleaved", list(range(a.agents)))):
            if a.budget_s and time.monotonic() - t_start > a.budget_s:
                a.notes.append(f"{name} {phase}: not run, the run's --budget-s {a.budget_s:.0f} was spent")
                a.partial = True
                continue
            port += 1
            tag = f"{name.replace(' ', '-')}-{phase}"
            s = start(tag, [*cmd, "--port", str(port)], a, port, env=env, cwd=cwd)
            ph = Phase()
            try:
                wait_ready(s, client, a.start_timeout)
                run_phase(s, client, agents, a, ph)
                if name == "bmoe":
                    ph.extra.update(store_figures(s, client))
                elif cwd is not None and name.endswith("disk"):
                    ph.extra["disk_bytes"] = sum(f.stat().st_size for f in cwd.rglob("*") if f.is_file())
            except Exception as exc:  # noqa: BLE001 - one engine's failure is a row, not the run
                a.notes.append(f"{tag}: {exc}")
                ph.extra["error"] = str(exc)[:300]
            finally:
                ph.extra.update(stop(s))
            report[name][phase] = {"steps": ph.steps, "read_mib": ph.read_mib, **ph.extra}  # type: ignore[index]
            print(f"{tag}: median step after the first {median_after_first(ph)}", file=sys.stderr)
    return report


def rows(report: dict[str, object]) -> list[dict[str, object]]:
    out = []
    for name, phases in report.items():
        for phase, d in phases.items():  # type: ignore[union-attr]
            steps = d["steps"]
            later = [r for r in steps if r["step"] > 0]
            med = statistics.median(r["wall_s"] for r in later) if later else None
            first = statistics.median(r["wall_s"] for r in steps if r["step"] == 0) if steps else None
            cached = [r["cached"] for r in later if r["cached"] is not None]
            out.append(
                {
                    "name": f"{name} {phase}",
                    "median_s": med,
                    "first_s": first,
                    "prompt_last": max((r["prompt"] or 0 for r in steps), default=None),
                    "cached_med": statistics.median(cached) if cached else None,
                    "read_mib": round(d["read_mib"], 1),
                    "ram_mib": d.get("bytes_ram", 0) / 2**20 if name == "bmoe" else None,
                    "disk_mib": (d.get("bytes_disk", 0) if name == "bmoe" else d.get("disk_bytes", 0)) / 2**20,
                    "peak_mib": d.get("peak_mib"),
                    "error": d.get("error", ""),
                }
            )
    return out


COLUMNS = (
    ("name", "server, phase", ""),
    ("median_s", "median step after the first (s)", ".2f"),
    ("first_s", "first step (s)", ".2f"),
    ("prompt_last", "longest prompt (tokens)", ""),
    ("cached_med", "cached tokens, median later step", ""),
    ("read_mib", "read from storage (MiB)", ".1f"),
    ("ram_mib", "store in RAM (MiB)", ".1f"),
    ("disk_mib", "store on disk (MiB)", ".1f"),
    ("peak_mib", "cgroup peak (MiB)", ""),
    ("error", "error", ""),
)


def targets(table_rows: list[dict[str, object]]) -> list[dict[str, object]]:
    by = {r["name"]: r for r in table_rows}
    out = []
    for name in sorted({str(r["name"]).rsplit(" ", 1)[0] for r in table_rows}):
        alone, inter = by.get(f"{name} alone", {}), by.get(f"{name} interleaved", {})
        ratio = None
        if alone.get("median_s") and inter.get("median_s"):
            ratio = round(float(inter["median_s"]) / float(alone["median_s"]), 2)  # type: ignore[arg-type]
        goal = f"<= {TARGET}x one agent alone"  # n/a where a phase failed part way
        out.append(
            record.target(
                f"{name}: interleaved / alone, median later step",
                ratio,
                goal,
                None if ratio is None or alone.get("error") or inter.get("error") else ratio <= TARGET,
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(BENCH_MODEL), help="a GGUF, or tiny:ARCH (a tiny test model)")
    ap.add_argument("--work", type=Path, default=HERE / "out" / "agents")
    ap.add_argument("--limit-gib", type=float, default=2.5, help="memory limit of every server; 0: none")
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--start-tokens", type=int, default=600)
    ap.add_argument("--grow-tokens", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--state-ram-mib", type=int, default=64)
    ap.add_argument("--state-disk-mib", type=int, default=1024)
    ap.add_argument("--llama-cache-mib", type=int, default=1024, help="llama-cpp-python's cache_size")
    ap.add_argument("--extras", type=Path, default=None, help="a folder holding llama-cpp-python's server extras")
    ap.add_argument("--port", type=int, default=8790)
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--step-timeout", type=float, default=900)
    ap.add_argument("--engines", nargs="*", default=[], help="only these servers: bmoe, llama-cpp-python ...")
    ap.add_argument("--budget-s", type=float, default=0, help="start no phase after this many seconds; 0: none")
    ap.add_argument("--no-cold", dest="cold", action="store_false", help="keep the page cache between servers")
    record.add_args(ap)
    a = ap.parse_args(argv)
    a.notes, a.partial = [], bool(a.engines)  # a subset of the servers is a partial run
    a.work.mkdir(parents=True, exist_ok=True)
    if a.model.startswith("tiny:"):
        from bmoe.testing import default_tiny_dir, write_tiny

        a.model_path = write_tiny(a.model[5:], "q8_0", Path(os.environ.get("BMOE_TINY_DIR") or default_tiny_dir()))
        a.notes.append(f"run on the tiny {a.model[5:]} model, not the bench model")
    else:
        a.model_path = Path(a.model)
    try:
        report = run(a)
    except CgroupError as exc:
        print(f"agents: {exc} (run as root on cgroup v1, or --limit-gib 0)", file=sys.stderr)
        return 2
    (a.work / "agents.json").write_text(json.dumps(report, indent=1))
    table_rows = rows(report)
    tgts = targets(table_rows)
    for r in table_rows:
        print(json.dumps(r), file=sys.stderr)
    for t in tgts:
        print(f"{t['verdict']}: {t['target']} = {t['value']} ({t['goal']})", file=sys.stderr)
    config = {k: v for k, v in vars(a).items() if k not in ("notes", "results", "partial")}
    rec = record.record(
        "agents",
        command=record.invocation("agents.py", argv),
        config=config,
        tables=[
            record.table(
                "Four agents in turns against one alone, per server",
                COLUMNS,
                table_rows,
                {"row": "bmoe alone", "key": "median_s", "label": "x bmoe alone"},
            )
        ],
        targets=tgts,
        notes=a.notes,
        partial=a.partial,
        machine_facts=record.machine(model=a.model_path if not a.model.startswith("tiny:") else None),
    )
    record.write(rec, a.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
