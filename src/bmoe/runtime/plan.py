"""The plan: the settings a session opens with, chosen from the machine and the model (docs/plan.md).

From the GGUF's header alone (no weights loaded) and what the machine allows (memory, cores, the
disk's read rate), ``make_plan`` chooses what the caller left open: resident or streamed; the
expert cache's budget; dense weights in anonymous memory or mapped; read-ahead; threads; the
prefill batch. A setting the caller chose (``SessionConfig.fixed``, or one that differs from its
default) is kept. ``Plan.config`` is the config the session then opens with.

Memory is what the process may still allocate at open (MemAvailable, capped by its memory
cgroup's headroom), less a reserve. A model runs resident when its whole file, its KV and the
compute buffers fit there; otherwise its experts stream and the rest of that memory holds the
dense weights, the KV, the compute buffers and the expert cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable

from bmoe.config import SessionConfig
from bmoe.errors import BmoeError
from bmoe.runtime.opening import check_opening
from bmoe.runtime.plan_facts import Machine, ModelFacts, compute_bytes, model_facts
from bmoe.runtime.state_store_open import DEFAULT_RAM_MIB
from bmoe.stream.disk_rate import DiskRate, read_rate
from bmoe.stream.layout import ModelLayout
from bmoe.stream.twin import default_twin_dir

MIB = 1 << 20
# Left for what grows after open beyond what is counted (HEAP, the lanes, the buffers): kept
# decision states, Python's objects of long sessions. It was 128 MiB before the heap and the
# streamer's buffers were counted; at a 1 GiB limit that much made the plan map the bench model's
# dense weights (0.2 tok/s) where holding them runs (#38.11).
RESERVE_MIN = 16 * MIB
RESERVE_FRAC = 0.05  # and this share of the memory on top
# What an open adds to the process beyond the weights, the KV, the compute buffers and the
# streamer's buffers: llama.cpp's own tables (vocabulary, graph), the chat template, Python's
# objects. Measured on the bench model, streamed: 35 MiB of anonymous memory at open and 14 more
# after the first answer beyond dense weights and one layer of expert buffers.
HEAP = 48 * MIB
LANE_BYTES = 1 << 20  # the reader's aligned bounce buffer, one per read lane (stream/reader.py)
WIDE_UBATCH = 2048  # a streamed prefill this wide reads each expert once per 2048 tokens
# Settings the plan chooses together: when the caller chose any of them, streaming is theirs.
STREAM_FIELDS = ("moe_stream", "cache_mb", "cache_ceil_mb", "cache_force", "prefetch", "dense_weights")
BATCH_FIELDS = ("n_batch", "n_ubatch")
_DEFAULTS = {f.name: f.default for f in fields(SessionConfig)}


class PlanMemoryError(BmoeError):
    """Not even the smallest configuration the plan knows fits in the memory this process may use."""


@dataclass(frozen=True, slots=True)
class Choice:
    field: str
    value: Any
    by: str  # "plan" or "you"
    why: str


@dataclass(frozen=True, slots=True)
class Plan:
    mode: str  # "resident" or "streamed"
    choices: tuple[Choice, ...]
    machine: Machine
    model: ModelFacts
    disk: DiskRate | None
    config: SessionConfig  # the config the session opens with

    def as_json(self) -> dict[str, Any]:
        disk = (
            None
            if self.disk is None
            else {
                "mib_s": round(self.disk.mib_s, 1),
                "source": self.disk.source,
                "file_system": self.disk.file_system,
                "odirect": self.disk.odirect,
            }
        )
        return {
            "mode": self.mode,
            "settings": {c.field: {"value": c.value, "by": c.by, "why": c.why} for c in self.choices},
            "machine": {
                "available_mib": self.machine.available // MIB,
                "limit_mib": None if self.machine.limit is None else self.machine.limit // MIB,
                "cores": self.machine.cores,
            },
            "model": {
                "file_mib": round(self.model.file_bytes / MIB, 1),
                "dense_mib": round(self.model.dense_bytes / MIB, 1),
                "expert_mib": round(self.model.expert_bytes / MIB, 1),
                "mmproj_mib": round(self.model.mmproj_bytes / MIB, 1),
                "token_mib": round(self.model.token_bytes / MIB, 2),
                "kv_mib": round(self.model.kv_bytes / MIB, 1),
            },
            "disk": disk,
        }

    def table(self) -> str:
        """The plan for people: one line per setting, its value, who chose it and why."""
        m, d = self.machine, self.model
        head = (
            f"plan: {self.mode}  (memory {m.available // MIB} MiB free"
            + (f", limit {m.limit // MIB} MiB" if m.limit is not None else "")
            + f", {m.cores} cores; model {d.file_bytes / MIB:.0f} MiB, experts {d.expert_bytes / MIB:.0f} MiB"
            + (f"; disk {self.disk.mib_s:.0f} MiB/s {self.disk.source}" if self.disk else "")
            + ")"
        )
        rows = [f"  {c.field:<14} {_show(c.value):<8} {c.by:<4}  {c.why}" for c in self.choices]
        return "\n".join([head, *rows])


def _show(v: Any) -> str:
    return "-" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def is_fixed(config: SessionConfig, name: str) -> bool:
    return name in config.fixed or getattr(config, name) != _DEFAULTS[name]


@dataclass(frozen=True, slots=True)
class Chosen:
    """One choice of the plan: its value and why."""

    value: Any
    why: str


@dataclass(frozen=True, slots=True)
class StreamChoice:
    """How a streamed model spends its memory: each a Chosen, in the order the plan shows them."""

    dense_weights: Chosen
    cache_mb: Chosen
    prefetch: Chosen
    n_ubatch: Chosen  # its value also sets n_batch (at least the config's)
    state_ram_mib: Chosen | None = None  # the state store's RAM tier, where the store is on


def choose_mode(config: SessionConfig, m: ModelFacts, room: int) -> Chosen:
    """Resident or streamed (``moe_stream``): streaming settings the user gave decide it; else
    resident where the whole model, its KV, the compute buffers and bmoe's own fit in ``room``, or
    where its experts cannot stream."""
    base_compute = compute_bytes(m, config.n_ubatch, config.n_ctx, config.flash_attn)
    resident_need = m.file_bytes + m.mmproj_bytes + m.kv_bytes + base_compute + HEAP
    stream_given = [f for f in STREAM_FIELDS if is_fixed(config, f)]
    if stream_given:
        return Chosen(config.moe_stream, f"streaming settings given ({', '.join(stream_given)})")
    if resident_need <= room:
        return Chosen(
            False,
            f"the whole model ({m.file_bytes / MIB:.0f} MiB), its KV and buffers "
            f"({(m.kv_bytes + base_compute) / MIB:.0f} MiB) fit in {room / MIB:.0f} MiB",
        )
    if m.why_not_streamed:
        return Chosen(False, f"does not fit in {room / MIB:.0f} MiB, but {m.why_not_streamed}: llama.cpp maps it")
    return Chosen(
        True,
        f"the model needs {resident_need / MIB:.0f} MiB with its KV and buffers, {room / MIB:.0f} MiB "
        "usable: its experts stream from the disk",
    )


def choose_stream(
    config: SessionConfig, m: ModelFacts, machine: Machine, room: int, disk_rate: DiskRate
) -> StreamChoice:
    """A streamed model's dense weights, expert cache, read-ahead and prefill ubatch in ``room``
    bytes; PlanMemoryError where not even the smallest configuration fits."""
    assert m.layout is not None  # streamed only where the experts can stream
    # the prefill batch first: a wider ubatch reads each expert once for more tokens, and its
    # compute buffers come out of the same memory as the cache
    batch_given = any(is_fixed(config, f) for f in BATCH_FIELDS)
    n_ub = config.n_ubatch if batch_given else min(WIDE_UBATCH, config.n_ctx)
    compute = compute_bytes(m, n_ub, config.n_ctx, config.flash_attn)
    lanes = config.io_threads * LANE_BYTES
    fixed_bytes = m.dense_bytes + m.mmproj_bytes + m.kv_bytes + HEAP + lanes
    left = room - fixed_bytes - compute
    if left < m.token_bytes and not batch_given:  # the wide buffers would leave no cache: stay narrow
        n_ub = config.n_ubatch
        compute = compute_bytes(m, n_ub, config.n_ctx, config.flash_attn)
        left = room - fixed_bytes - compute
    # Read-ahead reads the next layer's guessed experts while this one computes, every one of
    # them in a wide prefill: one layer of expert bytes more (measured on the bench model: the
    # cache on, 322 MiB above the same cache without it; the cache off, a second set of its
    # shared buffers, which fill up to the layer's experts as they are routed).
    states = choose_state_ram(config, left)
    if states is not None:
        left -= states.value * MIB  # memory given to kept states is taken from the expert cache
    can_prefetch = m.can_prefetch and config.prefill_device is None
    ahead = m.layer_bytes if can_prefetch and left - m.layer_bytes >= m.token_bytes else 0
    cache = _cache_mib(left - ahead, m)
    sets = 0 if cache else 2 if can_prefetch and left >= 2 * m.layer_bytes else 1
    prefetch = can_prefetch and (ahead > 0 if cache else sets == 2)
    dense = "anon" if left >= sets * m.layer_bytes else "mmap"
    if dense == "mmap" and left + m.dense_bytes < sets * m.layer_bytes:
        need = fixed_bytes - m.dense_bytes + compute + sets * m.layer_bytes
        raise PlanMemoryError(_too_little(config, m, machine, need, compute))
    passes = m.expert_bytes / MIB / max(disk_rate.mib_s, 1e-6)
    return StreamChoice(
        dense_weights=Chosen(
            dense,
            f"the dense weights ({m.dense_bytes / MIB:.0f} MiB) held where the kernel cannot drop them"
            if dense == "anon"
            else f"the dense weights ({m.dense_bytes / MIB:.0f} MiB) do not fit beside the KV and buffers: mapped",
        ),
        cache_mb=Chosen(
            int(cache),
            f"what is left after dense weights, KV ({m.kv_bytes / MIB:.0f} MiB), buffers "
            f"({(compute + HEAP + lanes) / MIB:.0f} MiB)"
            + (f", the state store's RAM tier ({states.value} MiB)" if states is not None and states.value else "")
            + (f" and read-ahead's staging ({ahead / MIB:.0f} MiB)" if ahead else "")
            + ", at most every expert"
            if cache
            else f"less than one token's experts ({m.token_bytes / MIB:.1f} MiB) left after dense weights, KV "
            f"and buffers: cache off, {sets} layer{'s' if sets > 1 else ''} of expert buffers "
            f"({sets * m.layer_bytes / MIB:.0f} MiB)",
        ),
        prefetch=Chosen(
            prefetch,
            "read the next layer's guessed experts while this one computes"
            if prefetch
            else "a prefill device is given"
            if m.can_prefetch and config.prefill_device is not None
            else f"its staging, one layer of experts ({m.layer_bytes / MIB:.0f} MiB), does not fit beside "
            + ("one token's experts in the cache" if cache else "the cache-off buffers")
            if m.can_prefetch
            else f"refused for {m.layout.arch} (bmoe-cli --list-archs)",
        ),
        n_ubatch=Chosen(
            n_ub,
            f"a prefill reads each expert once per ubatch ({passes:.1f} s for all of them at "
            f"{disk_rate.mib_s:.0f} MiB/s): {n_ub} tokens per read"
            if n_ub > config.n_ubatch
            else "wider compute buffers would leave no cache",
        ),
        state_ram_mib=states,
    )


def choose_state_ram(config: SessionConfig, left: int) -> Chosen | None:
    """The state store's RAM tier on a streamed model, where the store is on: what the user gave,
    else an eighth of what is left for the expert cache, at most DEFAULT_RAM_MIB (states spill to
    the flash tier; every MiB here is a MiB less of experts). None where the store is off."""
    if config.state_ram_mib is None and not config.state_disk_mib:
        return None
    if config.state_ram_mib is not None:
        return Chosen(config.state_ram_mib, "given")
    mib = max(1, min(DEFAULT_RAM_MIB, max(0, left) // 8 // MIB))  # 0 would turn the tier off
    return Chosen(
        mib,
        f"an eighth of what is left for the expert cache, at most {DEFAULT_RAM_MIB} MiB: memory given to kept "
        "states is taken from the experts, and states beyond it wait on flash",
    )


def choose_threads(machine: Machine) -> Chosen:
    return Chosen(machine.cores, f"the cores this process may use ({machine.cores})")


def make_plan(
    config: SessionConfig, machine: Machine | None = None, disk: Callable[[ModelLayout], DiskRate] | None = None
) -> Plan:
    """The plan for ``config`` on this machine (or ``machine``); ``disk`` measures the read rate of
    a streamed model's file system (default: remembered, or probed once, in the cache folder).
    Each choice is its own function (``choose_*``); this keeps what the user gave and shows who
    chose what."""
    machine = machine or Machine.here()
    m = model_facts(config)
    room = max(0, machine.available - RESERVE_MIN - int(RESERVE_FRAC * machine.available))
    choices: list[Choice] = []
    planned: dict[str, Any] = {}

    def choose(name: str, chosen: Chosen) -> None:
        if is_fixed(config, name):
            choices.append(Choice(name, getattr(config, name), "you", "given"))
        else:
            choices.append(Choice(name, chosen.value, "plan", chosen.why))
            planned[name] = chosen.value

    mode = choose_mode(config, m, room)
    stream_given = any(is_fixed(config, f) for f in STREAM_FIELDS)
    disk_rate = None
    if mode.value and not stream_given:
        assert m.layout is not None
        disk_rate = (
            disk
            or (lambda lay: read_rate(lay, _rates_dir(config), odirect=config.odirect, io_threads=config.io_threads))
        )(m.layout)
        st = choose_stream(config, m, machine, room, disk_rate)
        choose("moe_stream", mode)
        choose("dense_weights", st.dense_weights)
        choose("cache_mb", st.cache_mb)
        choose("prefetch", st.prefetch)
        if st.state_ram_mib is not None:
            choose("state_ram_mib", st.state_ram_mib)
        if any(is_fixed(config, f) for f in BATCH_FIELDS):  # the two sizes go together
            choices.extend(
                Choice(f, getattr(config, f), "you", "given" if is_fixed(config, f) else "the other size is given")
                for f in BATCH_FIELDS
            )
        else:
            choose("n_batch", Chosen(max(config.n_batch, st.n_ubatch.value), st.n_ubatch.why))
            choose("n_ubatch", st.n_ubatch)
    else:
        choices.append(Choice("moe_stream", config.moe_stream, "you" if stream_given else "plan", mode.why))
    choose("n_threads", choose_threads(machine))
    planned_config = replace(config, **planned) if planned else config
    return Plan(
        mode="streamed" if planned_config.moe_stream else "resident",
        choices=tuple(choices),
        machine=machine,
        model=m,
        disk=disk_rate,
        config=planned_config,
    )


def checked_plan(config: SessionConfig) -> Plan:
    """The plan ``config`` opens with (``--plan-only``), refused where opening would refuse, with
    the same error: opening plans, then runs ``check_opening`` on the planned config, or on the
    config as given where the header cannot be read (the file's own refusal then names it)."""
    try:
        plan = make_plan(config)
    except (OSError, ValueError):
        check_opening(config)
        raise
    check_opening(plan.config)
    return plan


def _cache_mib(left: int, m: ModelFacts) -> int:
    """The cache in ``left`` bytes, in MiB: at most every expert, 0 (off) below one token's experts,
    where a cache only churns."""
    cache = -(-m.expert_bytes // MIB) if left >= m.expert_bytes else max(0, left) // MIB
    return cache if cache * MIB >= m.token_bytes else 0


def _too_little(config: SessionConfig, m: ModelFacts, machine: Machine, need: int, compute: int) -> str:
    """The refusal of a machine where not even the smallest streamed configuration fits: the
    memory the process would need free at open (``need`` spent plus the reserve), and what it has."""
    free = math.ceil((need + RESERVE_MIN) / (1 - RESERVE_FRAC) / MIB)
    limit = f", limit {machine.limit // MIB} MiB" if machine.limit is not None else ""
    return (
        f"memory: {Path(config.model).name} needs {free} MiB free to open, and this process may use "
        f"{machine.available // MIB} MiB{limit}: streamed with the cache off and the dense weights mapped, "
        f"it holds one layer of expert buffers ({m.layer_bytes / MIB:.0f} MiB), the KV ({m.kv_bytes / MIB:.0f} MiB), "
        f"compute buffers ({compute / MIB:.0f} MiB) and bmoe's own ({(HEAP + config.io_threads * LANE_BYTES) / MIB:.0f} "
        f"MiB), plus a reserve of {RESERVE_MIN // MIB} MiB and {RESERVE_FRAC:.0%}; give it more memory or a "
        "smaller --ctx-size"
    )


def _rates_dir(config: SessionConfig) -> Path:
    return Path(config.twin_dir) if config.twin_dir else default_twin_dir().parent
