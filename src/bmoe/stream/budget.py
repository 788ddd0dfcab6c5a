"""The streamer's settings and how the cache budget is decided.

StreamSettings is built from a SessionConfig that was already checked (bmoe.config): nothing here
checks a value again. What only the model can tell (the budget's floor) is checked here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

from bmoe.errors import ConfigError
from bmoe.stream.layout import ModelLayout
from bmoe.stream.policy import DEFAULT_POLICY_NAME

MIB = 1 << 20
# auto: this share of what the process may still allocate; the rest is left for the KV cache,
# compute buffers, the dense weights' page cache and the rest of the system.
AUTO_FRACTION = 0.5


class CacheBudgetError(ConfigError):
    """The requested cache budget is below this model's one-token floor."""


@dataclass(frozen=True, slots=True)
class StreamSettings:
    cache_mb: int | Literal["auto"] = 0  # 0 = cache off (shared buffers, re-read every token)
    cache_ceil_mb: int | None = None  # cap for "auto"
    cache_force: bool = False  # accept a budget below the floor (it will churn)
    odirect: bool = True  # --no-odirect sets False
    io_threads: int = 4  # parallel read lanes
    read_all: bool = False  # verification: read every expert at every route (gate G3)
    policy: str = DEFAULT_POLICY_NAME  # which resident experts stay: policy.POLICIES


@dataclass(frozen=True, slots=True)
class Budget:
    budget_bytes: int  # 0 = cache off
    floor_bytes: int  # one token's routed working set
    source: str  # "off", "fixed", "auto", "auto-below-floor"


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text in ("", "max") else int(text)


def _stat(path: Path, *keys: str) -> int:
    """The first of ``keys`` found in a cgroup's ``memory.stat`` (0 when none is)."""
    try:
        pairs = dict(line.split() for line in path.read_text().splitlines() if line.count(" ") == 1)
    except (OSError, ValueError):
        return 0
    for key in keys:
        if key in pairs:
            return int(pairs[key])
    return 0


def cgroup_memory(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> tuple[int, int] | None:
    """(limit, usage) in bytes of the process's memory cgroup (v2, then v1), or None without a limit.

    Usage leaves out the cgroup's inactive file pages (``memory.stat``): clean page cache that the
    kernel reclaims before it kills anything. A container that has just copied or read its model
    holds hundreds of MB of it, which a plan must not count as taken (the kernel's own working
    set, what container runtimes report, leaves it out the same way)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":  # v2 unified
            base = root / rel.lstrip("/")
            limit, usage = _read_int(base / "memory.max"), _read_int(base / "memory.current")
            inactive = _stat(base / "memory.stat", "inactive_file")
        elif "memory" in controllers.split(","):
            base = root / "memory" / rel.lstrip("/")
            limit, usage = _read_int(base / "memory.limit_in_bytes"), _read_int(base / "memory.usage_in_bytes")
            inactive = _stat(base / "memory.stat", "total_inactive_file", "inactive_file")
        else:
            continue
        if limit is not None and usage is not None and limit < (1 << 60):
            return limit, max(0, usage - inactive)
    return None


def _cgroup_headroom() -> int | None:
    """Bytes the process's memory cgroup still allows, or None without a limit."""
    cg = cgroup_memory()
    return None if cg is None else max(0, cg[0] - cg[1])


def available_bytes() -> int:
    """What the process can still allocate: MemAvailable, capped by its cgroup's headroom."""
    avail = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) * 1024
    cg = _cgroup_headroom()
    return min(avail, cg) if cg is not None else avail


def most_cache_bytes(settings: StreamSettings, layout: ModelLayout) -> int | None:
    """The most bytes the expert cache of ``settings`` holds on any machine: a fixed budget, or
    auto's ceiling, capped at the model's expert bytes (a bigger cache would hold nothing more);
    0 with the cache off; None for auto without a ceiling, which depends on the machine's memory."""
    if settings.cache_mb == 0:
        return 0
    if settings.cache_mb == "auto":
        if settings.cache_ceil_mb is None:
            return None
        return min(settings.cache_ceil_mb * MIB, layout.expert_nbytes)
    return min(int(settings.cache_mb) * MIB, layout.expert_nbytes)


def resolve_budget(
    settings: StreamSettings,
    layout: ModelLayout,
    available: Callable[[], int] = available_bytes,
    warn: Callable[[str], None] = lambda m: None,
) -> Budget:
    """Turn cache_mb / cache_ceil_mb / cache_force into bytes, or raise CacheBudgetError."""
    floor = layout.floor_bytes()
    floor_mib = -(-floor // MIB)
    if settings.cache_mb == 0:
        return Budget(0, floor, "off")
    if settings.cache_mb == "auto":
        ceiling = most_cache_bytes(settings, layout)
        budget = min(int(available() * AUTO_FRACTION), layout.expert_nbytes if ceiling is None else ceiling)
        if budget < floor and not settings.cache_force:
            warn(f"bmoe: cache_mb auto found {budget // MIB} MiB, below the {floor_mib} MiB floor; cache off")
            return Budget(0, floor, "auto-below-floor")
        return Budget(budget, floor, "auto")
    budget = int(settings.cache_mb) * MIB
    if budget < floor and not settings.cache_force:
        per_expert = floor / (len(layout.layers) * layout.n_expert_used) / MIB
        raise CacheBudgetError(
            f"cache_mb: {settings.cache_mb} is below the floor of {floor_mib} MiB, one token's routed experts "
            f"({len(layout.layers)} layers x {layout.n_expert_used} experts x {per_expert:.2f} MiB); "
            f"a smaller cache only churns. Give {floor_mib} or more, 0 (cache off), or set cache_force"
        )
    return Budget(most_cache_bytes(settings, layout) or 0, floor, "fixed")
