"""The plan (docs/plan.md) on the tiny qwen3moe: what it chooses for a machine with plenty of memory
and for one where the model does not fit, what it leaves to the user, the remembered disk probe,
--plan-only, BMOE_READY's plan, and a planned streamed session answering as the resident one."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import pytest

import bmoe.runtime.plan as plan_mod
from bmoe.cli.loop import run_session
from bmoe.config import SessionConfig, default_model
from bmoe.runtime.plan import (
    HEAP,
    LANE_BYTES,
    MIB,
    RESERVE_FRAC,
    RESERVE_MIN,
    WIDE_UBATCH,
    Machine,
    compute_bytes,
    make_plan,
    model_facts,
)
from bmoe.runtime.results import GenerateRequest
from bmoe.session import Session, plan_for
from bmoe.stream.disk_rate import RATES_FILE, DiskRate, read_rate
from bmoe.stream.layout import read_layout

PLENTY = Machine(available=64 << 30, limit=None, cores=3)
DISK = DiskRate(mib_s=500.0, source="probed", file_system="test", probe_mib=64.0, odirect=True)


def _disk(layout) -> DiskRate:
    return DISK


OWN = HEAP + 4 * LANE_BYTES  # what a streamed open adds besides weights, KV, compute and expert buffers (4 lanes)


def smallest(m) -> int:
    """The room of the smallest streamed configuration: dense weights mapped, cache off, one layer of buffers."""
    return m.kv_bytes + compute_bytes(m, 512, 512) + OWN + m.layer_bytes


def machine_with_room(room: int) -> Machine:
    """A machine whose plan spends exactly ``room`` bytes (what is left after the reserve)."""
    return Machine(available=int((room + RESERVE_MIN) / (1 - RESERVE_FRAC)) + 16, limit=None, cores=2)


@pytest.fixture()
def model(tiny_models) -> Path:
    return tiny_models("qwen3moe", "q8_0")


def settings(plan) -> dict[str, tuple[object, str]]:
    return {c.field: (c.value, c.by) for c in plan.choices}


def test_a_model_that_fits_runs_resident_with_every_core(model) -> None:
    p = make_plan(SessionConfig(model=model, n_ctx=512), PLENTY, _disk)
    assert p.mode == "resident" and p.disk is None
    assert settings(p) == {"moe_stream": (False, "plan"), "n_threads": (3, "plan")}
    assert p.config.n_threads == 3 and not p.config.moe_stream


def test_a_model_that_does_not_fit_streams_with_the_rest_as_cache(model) -> None:
    cfg = SessionConfig(model=model, n_ctx=512)
    m = model_facts(cfg)
    wide = compute_bytes(m, min(WIDE_UBATCH, 512), 512)
    # room for the dense weights, the KV, wide buffers and 3 MiB of experts (about two tokens' worth)
    # (and one layer of experts more: read-ahead's staging)
    room = m.dense_bytes + m.kv_bytes + wide + OWN + m.layer_bytes + 3 * MIB
    p = make_plan(cfg, machine_with_room(room), _disk)
    s = settings(p)
    assert p.mode == "streamed" and p.disk is DISK
    assert s["moe_stream"] == (True, "plan") and s["dense_weights"] == ("anon", "plan")
    assert s["cache_mb"] == (3, "plan") and s["prefetch"] == (True, "plan")
    assert s["n_ubatch"] == (512, "plan") and s["n_batch"] == (512, "plan")  # n_ctx 512 caps the ubatch
    assert 3 * MIB >= m.token_bytes
    c = p.config
    assert (c.moe_stream, c.cache_mb, c.prefetch, c.dense_weights) == (True, 3, True, "anon")


def test_the_cache_holds_at_most_every_expert_and_is_off_below_one_token(model) -> None:
    cfg = SessionConfig(model=model, n_ctx=512)
    m = model_facts(cfg)
    base = m.dense_bytes + m.kv_bytes + compute_bytes(m, 512, 512) + OWN
    # not quite the whole file's worth of room: 64 bytes short (machine_with_room rounds up by less)
    p = make_plan(cfg, machine_with_room(base - 4 * LANE_BYTES + m.expert_bytes - 64), _disk)
    assert p.mode == "streamed"  # the resident need counts the same buffers but the lanes: a few bytes short streams
    assert p.config.prefetch  # its staging (one layer) comes out of the cache
    assert p.config.cache_mb * MIB >= m.expert_bytes - 4 * LANE_BYTES - m.layer_bytes - MIB
    p = make_plan(cfg, machine_with_room(base + m.token_bytes // 2), _disk)
    assert settings(p)["cache_mb"][0] == 0 and p.config.moe_stream
    p = make_plan(cfg, machine_with_room(smallest(m)), _disk)  # not even the dense weights fit
    assert (p.config.dense_weights, p.config.cache_mb, p.config.prefetch) == ("mmap", 0, False)


def test_what_the_user_gives_is_kept(model) -> None:
    tight = machine_with_room(smallest(model_facts(SessionConfig(model=model, n_ctx=512))))
    # any streaming setting leaves streaming to the user: nothing else of it is planned
    p = make_plan(SessionConfig(model=model, n_ctx=512, moe_stream=True, n_threads=1), tight, _disk)
    assert settings(p) == {"moe_stream": (True, "you"), "n_threads": (1, "you")}
    assert p.config.cache_mb == 0 and not p.config.prefetch and p.disk is None
    # a field named in fixed is kept at its default value
    p = make_plan(SessionConfig(model=model, n_ctx=512, fixed=frozenset({"n_threads", "n_ubatch"})), tight, _disk)
    s = settings(p)
    assert s["n_threads"] == (0, "you") and s["n_ubatch"] == (512, "you") and s["n_batch"] == (512, "you")
    assert p.config.moe_stream  # the rest is still planned
    # a prefill device keeps read-ahead off
    p = make_plan(SessionConfig(model=model, n_ctx=512, prefill_device="CUDA0"), tight, _disk)
    assert settings(p)["prefetch"] == (False, "plan")


def test_a_dense_model_stays_resident_whatever_its_size() -> None:
    p = make_plan(SessionConfig(model=default_model(), n_ctx=512), machine_with_room(0), _disk)
    assert p.mode == "resident" and settings(p)["moe_stream"] == (False, "plan")
    assert "a dense model: it has no experts to stream" in p.choices[0].why


def test_plan_off_has_no_plan_and_an_unreadable_header_opens_as_given(model, tmp_path) -> None:
    assert plan_for(SessionConfig(model=model, plan="off")) is None
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 12)
    assert plan_for(SessionConfig(model=bad)) is None


def test_the_disk_probe_is_remembered_per_file_system(model, tmp_path) -> None:
    layout = read_layout(model)
    first = read_rate(layout, tmp_path)
    assert first.source == "probed" and first.mib_s > 0
    assert first.probe_mib * MIB >= min(64 * MIB, layout.expert_nbytes)  # whole slices, at least that much
    again = read_rate(layout, tmp_path)
    assert again.source == "remembered" and again.mib_s == first.mib_s
    stored = json.loads((tmp_path / RATES_FILE).read_text())
    assert list(stored) == [first.file_system]
    (tmp_path / RATES_FILE).write_text("not json")  # a damaged store is probed again, not an error
    assert read_rate(layout, tmp_path).source == "probed"


def test_plan_only_prints_the_plan_without_opening(model, monkeypatch, capsys) -> None:
    from bmoe.cli.main import main

    def refuse(*a, **kw):
        raise AssertionError("--plan-only opened a session")

    monkeypatch.setattr(Session, "__init__", refuse)
    assert main(["-m", str(model), "--plan-only", "-c", "512"]) == 0
    out, err = capsys.readouterr()
    shown = json.loads(out)
    assert shown["mode"] == "resident" and shown["settings"]["moe_stream"]["by"] == "plan"
    assert err.startswith("plan: resident") and "n_threads" in err
    assert main(["-m", str(model), "--plan-only", "--plan", "off"]) == 2
    assert "--plan off has none" in capsys.readouterr().err


def test_a_planned_streamed_session_answers_as_the_resident_one(model, monkeypatch, tmp_path) -> None:
    cfg = dict(model=model, n_ctx=512, n_threads=1, twin_dir=tmp_path)
    m = model_facts(SessionConfig(**cfg))
    room = m.dense_bytes + m.kv_bytes + compute_bytes(m, 512, 512) + OWN + m.layer_bytes + 2 * MIB
    monkeypatch.setattr(plan_mod.Machine, "here", staticmethod(lambda: machine_with_room(room)))
    gen = GenerateRequest(prompt="Tell me about the sea.", n_predict=12, keep_logits=True)
    with Session(SessionConfig(**cfg)) as planned:
        assert planned.plan.mode == "streamed" and planned.streaming is not None
        assert planned.config.cache_mb == 2 and planned.config.prefetch
        a = planned.generate(gen)
        out = io.StringIO()
        run_session(planned, io.StringIO(""), out)
        ready = json.loads(out.getvalue().splitlines()[0].partition(" ")[2])
        assert ready["plan"] == planned.plan.as_json() and ready["streaming"] is True
        assert ready["plan"]["settings"]["cache_mb"]["value"] == 2
    with Session(SessionConfig(**cfg, plan="off")) as resident:
        assert resident.plan is None and resident.streaming is None
        b = resident.generate(gen)
    assert a.tokens == b.tokens
    assert all(np.array_equal(x, y) for x, y in zip(a.logits, b.logits, strict=True))


def test_flash_attention_off_counts_the_attention_scores_and_leaves_less_cache(model, monkeypatch) -> None:
    """llama.cpp computes attention in tiles with flash attention (which ``None`` lets it turn on
    for the CPU); turned off, a ubatch's scores over the whole context are one more buffer."""
    cfg = SessionConfig(model=model, n_ctx=512)
    m = dataclasses.replace(model_facts(cfg), file_bytes=1 << 40)  # never resident: the cache is compared
    monkeypatch.setattr(plan_mod, "model_facts", lambda config: m)
    tiled, whole = compute_bytes(m, 512, 512), compute_bytes(m, 512, 512, False)
    assert whole - tiled == 512 * 512 * m.n_head * 4 and compute_bytes(m, 512, 512, True) == tiled
    room = m.dense_bytes + m.kv_bytes + whole + OWN + m.layer_bytes + 3 * MIB
    auto = make_plan(cfg, machine_with_room(room), _disk)
    off = make_plan(dataclasses.replace(cfg, flash_attn=False), machine_with_room(room), _disk)
    assert off.config.cache_mb == 3
    assert auto.config.cache_mb * MIB >= 3 * MIB + whole - tiled - MIB


def test_the_cache_off_counts_its_expert_buffers_and_read_ahead_a_second_layer_of_them(model, monkeypatch) -> None:
    """#38.11: with the cache off each layer's shared buffers fill up to the layer's experts, and
    read-ahead reads the next layer into a second set: the plan counts them (and the reader's lanes
    and the heap), so it no longer picks cache 0 with read-ahead where one layer's room is left."""
    cfg = SessionConfig(model=model, n_ctx=512)
    real = model_facts(cfg)
    assert real.layer_bytes == 16 * real.token_bytes // (4 * 2)  # 16 experts a layer; 4 layers of 2 routed
    # the bench model's shape: one layer's experts weigh as much as one token's (16 layers x 8 of 128)
    m = dataclasses.replace(real, layer_bytes=real.token_bytes)
    monkeypatch.setattr(plan_mod, "model_facts", lambda config: m)
    base = m.dense_bytes + m.kv_bytes + compute_bytes(m, 512, 512) + OWN
    short = make_plan(cfg, machine_with_room(base + m.token_bytes - MIB // 2), _disk)
    s = settings(short)
    assert s["cache_mb"] == (0, "plan") and s["prefetch"] == (False, "plan") and s["dense_weights"] == ("mmap", "plan")
    assert short.choices[2].why.endswith(f"cache off, 1 layer of expert buffers ({m.layer_bytes / MIB:.0f} MiB)")
    # with room for a token's experts (whole MiB) the cache is on; read-ahead's staging (a layer) does not fit
    on = make_plan(cfg, machine_with_room(base + 2 * MIB), _disk)
    assert (on.config.cache_mb, on.config.prefetch) == (2, False)
    assert (
        settings(on)["prefetch"] == (False, "plan") and "does not fit beside one token's experts" in on.choices[3].why
    )
    on = make_plan(cfg, machine_with_room(base + m.layer_bytes + 2 * MIB), _disk)
    assert (on.config.cache_mb, on.config.prefetch) == (2, True)
    # a model whose layer is small against a token: cache off, two sets of buffers and read-ahead
    small = dataclasses.replace(real, layer_bytes=real.token_bytes // 4)
    monkeypatch.setattr(plan_mod, "model_facts", lambda config: small)
    p = make_plan(cfg, machine_with_room(base + small.token_bytes - MIB // 4), _disk)
    assert settings(p)["prefetch"] == (True, "plan") and p.config.cache_mb == 0 and p.config.dense_weights == "anon"
    p = make_plan(cfg, machine_with_room(base + 2 * small.layer_bytes - 64), _disk)
    assert (p.config.prefetch, p.config.dense_weights) == (False, "anon")


def test_below_the_smallest_configuration_the_open_refuses_naming_the_memory_it_needs(
    model, monkeypatch, capsys
) -> None:
    import bmoe.runtime.runtime as runtime_mod
    from bmoe.cli.main import main

    cfg = SessionConfig(model=model, n_ctx=512)
    m = model_facts(cfg)
    need = smallest(m)
    make_plan(cfg, machine_with_room(need), _disk)  # the smallest configuration is planned
    tight = Machine(available=machine_with_room(need - 64).available, limit=300 * MIB, cores=2)
    free = -(-int((need + RESERVE_MIN) / (1 - RESERVE_FRAC)) // MIB)
    line = (
        f"memory: {model.name} needs {free} MiB free to open, and this process may use "
        f"{tight.available // MIB} MiB, limit 300 MiB: streamed with the cache off and the dense weights mapped, "
        f"it holds one layer of expert buffers (3 MiB), the KV ({m.kv_bytes / MIB:.0f} MiB), compute buffers "
        f"({compute_bytes(m, 512, 512) / MIB:.0f} MiB) and bmoe's own (52 MiB), plus a reserve of {RESERVE_MIN // MIB} MiB and "
        "5%; give it more memory or a smaller --ctx-size"
    )
    with pytest.raises(plan_mod.PlanMemoryError) as e:
        make_plan(cfg, tight, _disk)
    assert str(e.value) == line
    monkeypatch.setattr(plan_mod.Machine, "here", staticmethod(lambda: tight))
    monkeypatch.setattr(plan_mod, "read_rate", lambda *a, **kw: DISK)

    def never(*a, **kw):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(runtime_mod, "LlamaModel", never)
    monkeypatch.setattr(runtime_mod, "open_streaming", never)
    for flags in (["--plan-only"], ["-p", "hi"]):  # --plan-only and the open: one line, exit 1
        assert main(["-m", str(model), "-c", "512", *flags]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err.splitlines() == [f"bmoe-cli: {line}"]


def test_the_lanes_the_plan_counts_are_the_reader_s_bounce_buffers() -> None:
    from bmoe.stream import reader

    assert LANE_BYTES == reader._BOUNCE_BYTES


def test_the_state_stores_ram_tier_is_taken_from_the_expert_cache(model) -> None:
    cfg = SessionConfig(model=model, n_ctx=512, decide=True)
    m = model_facts(cfg)
    wide = compute_bytes(m, min(WIDE_UBATCH, 512), 512)
    room = m.dense_bytes + m.kv_bytes + wide + OWN + m.layer_bytes + 4 * MIB  # streamed, as above
    alone = settings(make_plan(cfg, machine_with_room(room), _disk))
    given = make_plan(dataclasses.replace(cfg, state_ram_mib=1), machine_with_room(room), _disk)
    assert settings(given)["state_ram_mib"] == (1, "you") and settings(given)["cache_mb"][0] == alone["cache_mb"][0] - 1
    assert "the state store's RAM tier (1 MiB)" in next(c.why for c in given.choices if c.field == "cache_mb")
    planned = make_plan(dataclasses.replace(cfg, state_disk_mib=64), machine_with_room(room), _disk)
    mib, by = settings(planned)["state_ram_mib"]
    left = room - (m.dense_bytes + m.kv_bytes + wide + OWN)  # what the cache could have had
    assert by == "plan" and mib == max(1, left // 8 // MIB) and planned.config.state_ram_mib == mib
    assert "taken from the experts" in next(c.why for c in planned.choices if c.field == "state_ram_mib")
