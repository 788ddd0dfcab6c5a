"""Run a command in a fresh cgroup-v1 memory cgroup, with the page cache dropped first.

The cgroup is made under this process's own memory cgroup (read from /proc/self/cgroup), so it
works inside a container whose root cgroup is not writable; the child moves itself in before it
execs, so every page it touches, page cache included, is charged to the limit from the start.
Needs root (cgroup writes, /proc/sys/vm/drop_caches).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

V1_MEMORY = Path("/sys/fs/cgroup/memory")


class CgroupError(RuntimeError):
    """A memory cgroup could not be made or used here (no cgroup v1, not root, ...)."""


def own_memory_cgroup() -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        if "memory" in controllers.split(","):
            return V1_MEMORY / rel.lstrip("/")
    raise CgroupError("no cgroup-v1 memory controller in /proc/self/cgroup")


def drop_caches() -> None:
    """Write dirty pages back, then drop the page cache, dentries and inodes (machine-wide)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


@dataclass(frozen=True, slots=True)
class Outcome:
    returncode: int
    wall_s: float
    oom_kills: int  # the cgroup's oom_kill counter (0 without a limit)
    max_usage_mib: float  # the cgroup's peak charge, page cache included
    stderr_tail: str

    @property
    def oom_killed(self) -> bool:
        return self.oom_kills > 0 or self.returncode == -9


def _oom_kills(cg: Path) -> int:
    for line in (cg / "memory.oom_control").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def run_limited(
    cmd: list[str], limit_bytes: int | None, *, timeout_s: float, cold: bool = True, tag: str = "run"
) -> Outcome:
    """Run ``cmd`` under ``limit_bytes`` of memory (None: no cgroup) after dropping caches (``cold``)."""
    cg: Path | None = None
    if limit_bytes is not None:
        cg = own_memory_cgroup() / f"bmoe-bench-{os.getpid()}-{tag}"
        try:
            cg.mkdir()  # never an earlier run's, whose peak and OOM count it would still carry
            (cg / "memory.limit_in_bytes").write_text(str(limit_bytes))
        except OSError as exc:
            raise CgroupError(f"cannot make a memory cgroup at {cg}: {exc}") from exc
    procs = cg / "cgroup.procs" if cg is not None else None

    def enter() -> None:  # runs in the child between fork and exec
        if procs is not None:
            procs.write_text(str(os.getpid()))

    if cold:
        drop_caches()
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, preexec_fn=enter, capture_output=True, text=True, timeout=timeout_s, check=False)
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, err = -999, f"timed out after {timeout_s} s\n{exc.stderr or ''}"
    wall = time.perf_counter() - t0
    kills, peak = 0, 0.0
    if cg is not None:
        kills = _oom_kills(cg)
        peak = int((cg / "memory.max_usage_in_bytes").read_text()) / 2**20
        try:
            cg.rmdir()  # charges left (page cache) move to the parent
        except OSError:
            pass
    return Outcome(rc, wall, kills, peak, (err or "")[-2000:])
