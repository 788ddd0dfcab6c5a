"""The plan's output, pinned: every setting, value, author and reason, and the table, for a grid of
machines and configs on the tiny qwen3moe (and on its facts reshaped as the bench model's, whose
layer of experts weighs one token's). A rewrite of make_plan (#40.5) must keep each byte of it.

Regenerate only for an intended change: ``BMOE_PLAN_GOLDEN=write pytest tests/engine/test_plan_golden.py``."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

import bmoe.runtime.plan as plan_mod
from bmoe.config import SessionConfig
from bmoe.runtime.plan import (
    HEAP,
    LANE_BYTES,
    MIB,
    RESERVE_FRAC,
    RESERVE_MIN,
    Machine,
    PlanMemoryError,
    compute_bytes,
    make_plan,
    model_facts,
)
from bmoe.stream.disk_rate import DiskRate

GOLDEN = Path(__file__).parent / "data" / "plan_golden.json"
DISK = DiskRate(mib_s=500.0, source="probed", file_system="test", probe_mib=64.0, odirect=True)
CONFIGS = {
    "default": {},
    "flash_off": {"flash_attn": False},
    "prefill_device": {"prefill_device": "CUDA0"},
    "ubatch_given": {"fixed": frozenset({"n_ubatch"})},
    "stream_given": {"moe_stream": True},
    "threads_given": {"n_threads": 1},
    "ctx_4096": {"n_ctx": 4096},
}


def _machine(room: int) -> Machine:
    return Machine(available=int((room + RESERVE_MIN) / (1 - RESERVE_FRAC)) + 16, limit=1 << 30, cores=2)


def _outputs(model: Path, monkeypatch, shape: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, kw in CONFIGS.items():
        cfg = SessionConfig(model=model, **{"n_ctx": 512, **kw})
        m = model_facts(cfg)
        if shape == "bench":
            m = dataclasses.replace(m, layer_bytes=m.token_bytes)
        monkeypatch.setattr(plan_mod, "model_facts", lambda config, m=m: m)
        base = m.dense_bytes + m.kv_bytes + compute_bytes(m, 512, cfg.n_ctx) + HEAP + 4 * LANE_BYTES
        smallest = base - m.dense_bytes + m.layer_bytes
        rooms = {
            "below": smallest - 64,
            "smallest": smallest,
            "under_token": base + m.token_bytes - MIB // 2,
            "two_mib": base + 2 * MIB,
            "layer_two_mib": base + m.layer_bytes + 2 * MIB,
            "most": base + m.expert_bytes - 64,
            "plenty": 64 << 30,
        }
        for room_name, room in rooms.items():
            try:
                p = make_plan(cfg, _machine(room), lambda layout: DISK)
                got: object = {
                    "json": p.as_json(),
                    "table": p.table(),
                    "config": {
                        f: getattr(p.config, f)
                        for f in (
                            "moe_stream",
                            "cache_mb",
                            "prefetch",
                            "dense_weights",
                            "n_batch",
                            "n_ubatch",
                            "n_threads",
                        )
                    },
                }
            except PlanMemoryError as e:
                got = {"refused": str(e)}
            out[f"{shape}/{name}/{room_name}"] = json.loads(json.dumps(got, default=str))
        monkeypatch.undo()
    return out


@pytest.mark.parametrize("shape", ["tiny", "bench"])
def test_the_plan_s_output_is_unchanged(shape: str, tiny_models, monkeypatch) -> None:
    model = tiny_models("qwen3moe", "q8_0")
    got = _outputs(model, monkeypatch, shape)
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("BMOE_PLAN_GOLDEN") == "write":
        golden.update(got)
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    model_dir = str(model.parent)
    want = {k: v for k, v in golden.items() if k.startswith(f"{shape}/")}
    assert json.loads(json.dumps(got).replace(model_dir, "<tiny>")) == json.loads(
        json.dumps(want).replace(model_dir, "<tiny>")
    )
