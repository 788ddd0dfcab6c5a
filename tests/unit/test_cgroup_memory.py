"""The memory a cgroup leaves the process (bmoe.stream.budget.cgroup_memory), on fake cgroup trees of
both versions: clean page cache (memory.stat's inactive file pages) is not counted as taken."""

from __future__ import annotations

from pathlib import Path

import pytest

import bmoe.stream.budget as budget
from bmoe.runtime.plan import Machine

MIB = 1 << 20
# The case: a 400 MiB cgroup that has just written and synced 330 MB (clean page cache)
LIMIT, USAGE, INACTIVE = 400 * MIB, 374 * MIB, 330 * MIB


def fake_tree(tmp_path: Path, version: int, *, inactive_key: str) -> tuple[Path, Path]:
    root = tmp_path / "sys"
    proc = tmp_path / "cgroup"
    if version == 2:
        base = root / "bmoe" / "job"
        base.mkdir(parents=True)
        (base / "memory.max").write_text(f"{LIMIT}\n")
        (base / "memory.current").write_text(f"{USAGE}\n")
        proc.write_text("0::/bmoe/job\n")
    else:
        base = root / "memory" / "bmoe" / "job"
        base.mkdir(parents=True)
        (base / "memory.limit_in_bytes").write_text(f"{LIMIT}\n")
        (base / "memory.usage_in_bytes").write_text(f"{USAGE}\n")
        proc.write_text("12:cpu,cpuacct:/\n7:memory:/bmoe/job\n")
    (base / "memory.stat").write_text(
        f"cache {INACTIVE + 4 * MIB}\nactive_file {4 * MIB}\n{inactive_key} {INACTIVE}\nanon 40000000\n"
    )
    return proc, root


@pytest.mark.parametrize("version, key", [(2, "inactive_file"), (1, "total_inactive_file"), (1, "inactive_file")])
def test_inactive_file_pages_are_not_counted_as_used(tmp_path: Path, version: int, key: str) -> None:
    proc, root = fake_tree(tmp_path, version, inactive_key=key)
    assert budget.cgroup_memory(proc, root) == (LIMIT, USAGE - INACTIVE)


def test_without_memory_stat_usage_is_taken_as_it_is(tmp_path: Path) -> None:
    proc, root = fake_tree(tmp_path, 2, inactive_key="inactive_file")
    (root / "bmoe" / "job" / "memory.stat").unlink()
    assert budget.cgroup_memory(proc, root) == (LIMIT, USAGE)


@pytest.mark.parametrize("version", [1, 2])
def test_the_plan_sees_the_reclaimable_cache_as_free(tmp_path: Path, version: int, monkeypatch, tiny_models) -> None:
    """A tiny model in such a cgroup runs resident (the plan said "streamed (memory 26 MiB free)")."""
    from bmoe.config import SessionConfig
    from bmoe.runtime.plan import make_plan
    from bmoe.stream.disk_rate import DiskRate

    proc, root = fake_tree(tmp_path, version, inactive_key="inactive_file")
    real = budget.cgroup_memory
    monkeypatch.setattr(budget, "cgroup_memory", lambda: real(proc, root))
    import bmoe.runtime.plan_facts as plan_facts

    monkeypatch.setattr(plan_facts, "cgroup_memory", lambda: real(proc, root))
    machine = Machine.here()
    assert machine.limit == LIMIT and machine.available == LIMIT - (USAGE - INACTIVE)  # the host has more
    disk = DiskRate(mib_s=500.0, source="probed", file_system="test", probe_mib=64.0, odirect=True)
    p = make_plan(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=512), machine, lambda layout: disk)
    assert p.mode == "resident"
