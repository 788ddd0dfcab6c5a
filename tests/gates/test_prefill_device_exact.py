"""G18g: with a prefill device, decisions and a chat turn after them equal the all-CPU session bit for bit.

The device is llama.cpp's RPC backend served by this process's CPU on 127.0.0.1, with CUDA's
offload rule installed (bmoe.llama.rpc_device): ggml's scheduler copies the host weights to it
per graph and reads results back exactly as it would for a GPU, and since the far side runs the
same CPU kernels, "equal" can mean bit for bit. Both sides of every equality use the same ubatch
split (a different split changes the numbers by itself).

What each ubatch ran on is observed, not inferred: a cb_eval observer records, for every graph
node, its width and whether its buffer is on the host, which is how "prefill_dev_tokens counts
exactly the wide pieces" and "a narrow tail is not offloaded" are checked.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import llama_cpp  # noqa: E402
import numpy as np
import pytest

import bmoe.runtime.runtime as session_mod
from bmoe.cli import main as cli_main
from bmoe.config import SessionConfig
from bmoe.decide.decider import DecidePolicy
from bmoe.decide.types import DecideRequest
from bmoe.errors import ConfigError
from bmoe.llama import rpc_device
from bmoe.llama.devices import (
    PrefillDeviceError,
    ggml,
    offload_threshold,
    ubatch_widths,
)
from bmoe.llama.ggml_tensor import GgmlTensor
from bmoe.runtime.results import GenerateRequest
from bmoe.session import Session
from bmoe.wire.records import decide_fields, done_fields
from helpers.decide_prompts import ABC, FULL_ARCHS, MODES, P1, P2, S1, S2, S3

MIN = 16  # --prefill-min-tokens, and the rule installed on the RPC device
UBATCH = 16  # every prompt below is a few full ubatches and a narrower tail
REQUESTS = [(1, P1, S1), (2, P1, S2), (3, P2, S3)]
# One node per ubatch graph, as wide as the ubatch, first in layer 0: the norm before the token
# mixer, which lfm2moe's graph (lfm2.cpp) names "model.layers.{}.operator_norm".
LAYER0 = (b"attn_norm-0", b"model.layers.{}.operator_norm-0")


@pytest.fixture(scope="module")
def rpc() -> rpc_device.RpcPrefillDevice:
    if not rpc_device.rpc_supported():
        pytest.fail(
            "G18g needs llama-cpp-python built with RPC: reinstall it with "
            "CMAKE_ARGS=-DGGML_RPC=ON (scripts/setup.sh does this when llama_supports_rpc() is false)"
        )
    return rpc_device.rpc_prefill_device(MIN)


# --- observing where each ubatch ran ------------------------------------------------------
MATMULS = ("MUL_MAT", "MUL_MAT_ID")


@dataclass
class Ubatch:
    width: int
    ops: dict[str, list[int]] = field(default_factory=dict)  # op -> [nodes, nodes on the device]
    weight_matmuls: list[tuple[int, bool]] = field(default_factory=list)  # (batch, on the device)
    weights_off_host: list[str] = field(default_factory=list)
    device_weight_ops: set[str] = field(default_factory=set)  # ops that read a weight and ran on the device

    def count(self, op: str, *, device: bool = False) -> int:
        return self.ops.get(op, [0, 0])[1 if device else 0]

    @property
    def on_device(self) -> bool:
        """Its weight matmuls ran on the device (check_placement: exactly the wide ones)."""
        return any(dev for _, dev in self.weight_matmuls)

    @property
    def device_ops(self) -> set[str]:
        return {op for op, (_, n_dev) in self.ops.items() if n_dev}


def _is_weight(name: bytes) -> bool:
    """A model tensor, or the scheduler's copy of one on the device (named after it)."""
    return b".weight" in name or b".bias" in name


class Observer:
    """Records, for every graph node of every session opened in a test, where it ran."""

    def __init__(self) -> None:
        ggml()  # libggml mapped and checked by soname
        base = ctypes.CDLL("libggml.so.0", mode=os.RTLD_NOLOAD)
        base.ggml_backend_buffer_is_host.restype, base.ggml_backend_buffer_is_host.argtypes = (
            ctypes.c_bool,
            [ctypes.c_void_p],
        )
        base.ggml_backend_buffer_get_usage.restype, base.ggml_backend_buffer_get_usage.argtypes = (
            ctypes.c_int,
            [ctypes.c_void_p],
        )
        base.ggml_op_name.restype, base.ggml_op_name.argtypes = ctypes.c_char_p, [ctypes.c_int]
        self._lib = base
        self.ubatches: list[Ubatch] = []

    def tap(self, inner: object | None) -> Tap:
        return Tap(self, inner)

    def _look(self, t: int) -> None:
        s = GgmlTensor.from_address(t)
        if s.name in LAYER0:
            self.ubatches.append(Ubatch(width=int(s.ne[1])))
        if not self.ubatches or not s.buffer:
            return
        ub = self.ubatches[-1]
        op = self._lib.ggml_op_name(s.op).decode()
        counts = ub.ops.setdefault(op, [0, 0])
        counts[0] += 1
        on_device = not self._lib.ggml_backend_buffer_is_host(s.buffer)
        counts[1] += on_device
        if on_device and any(src and _is_weight(GgmlTensor.from_address(src).name) for src in s.src):
            ub.device_weight_ops.add(op)
        if op in MATMULS and s.src[0] and b".weight" in GgmlTensor.from_address(s.src[0]).name:
            # the rows CUDA's rule measures: tokens for a matmul, tokens (ne[2]) for MUL_MAT_ID
            ub.weight_matmuls.append((int(s.ne[1] if op == "MUL_MAT" else s.ne[2]), on_device))
        for src in s.src:
            if not src:
                continue
            w = GgmlTensor.from_address(src)
            # usage 1: GGML_BACKEND_BUFFER_USAGE_WEIGHTS, the model's own weight buffers
            if (
                w.buffer
                and self._lib.ggml_backend_buffer_get_usage(w.buffer) == 1
                and not self._lib.ggml_backend_buffer_is_host(w.buffer)
            ):
                ub.weights_off_host.append(w.name.decode())

    def take(self) -> list[Ubatch]:
        out, self.ubatches = self.ubatches, []
        return out


class Tap:
    """One context's cb_eval: never asks for data itself (so it changes no split), passes every
    call on to the streaming hook when the session streams."""

    def __init__(self, obs: Observer, inner: object | None) -> None:
        self.obs, self.inner = obs, inner
        self.c_callback = llama_cpp.ggml_backend_sched_eval_callback(self._cb)
        self.c_abort_callback = llama_cpp.ggml_abort_callback(self._abort)

    def raise_if_failed(self) -> None:
        if self.inner is not None:
            self.inner.raise_if_failed()

    def _abort(self, data: object) -> bool:
        return bool(self.inner is not None and self.inner._abort(data))

    def _cb(self, t: int | None, ask: bool, user: object) -> bool:
        if ask and t:
            self.obs._look(t)
        return bool(self.inner._callback(t, ask, user)) if self.inner is not None else False


@pytest.fixture()
def observed(monkeypatch: pytest.MonkeyPatch) -> Observer:
    """Every LlamaContext the sessions open in this test reports to one Observer."""
    obs = Observer()
    real = session_mod.LlamaContext

    def make(model, params, eval_callback=None):
        return real(model, params, eval_callback=obs.tap(eval_callback))

    monkeypatch.setattr(session_mod, "LlamaContext", make)
    return obs


@pytest.fixture()
def open_pair(tiny_models, rpc) -> Iterator[Callable[..., tuple[Session, Session]]]:
    """A session with the RPC prefill device and the same session all on the CPU."""
    opened: list[Session] = []

    def _open(arch: str, mode: str, **kw: object) -> tuple[Session, Session]:
        base = dict(
            model=tiny_models(arch, "q8_0"),
            n_ctx=512,
            n_batch=512,
            n_ubatch=UBATCH,
            n_predict=12,
            n_threads=2,
            decide=True,
            **MODES[mode],
        )
        base.update(kw)
        dev = Session(SessionConfig(**base, prefill_device=rpc.name, prefill_min_tokens=MIN))
        opened.append(dev)
        cpu = Session(SessionConfig(**base, decide_prefix_cache="off"))
        opened.append(cpu)
        return dev, cpu

    yield _open
    for s in opened:
        s.close()


# CUDA's rule measures an elementwise op by its rows: a per-head norm's multiply on a ubatch of n
# tokens has n_head * n rows, so it goes to the device even in a narrow tail. Matmuls never do.
# The same holds for a Mamba2 layer's per-head skip (ssm_d) and for a per-expert bias (gpt-oss's
# ffn_*_exps.bias: its ADD_ID has n_expert_used * n rows). The scheduler then runs the weightless
# ops next to such an op (ADD, GLU, CONT, RMS_NORM, ...) there too; those copy no weight. So in a
# narrow tail, the only ops that read a weight on the device are these elementwise ones, and a
# per-head ROPE whose frequency factors are a weight (gemma4's rope_freqs.weight), and glm5-next's
# mixing of its four residual streams (mHC: an ADD of a per-stream weight and DSV4_HC_COMB, four rows
# per token).
NARROW_TAIL_WEIGHT_OPS = {"MUL", "ADD_ID", "ROPE", "ADD", "DSV4_HC_COMB"}


def check_placement(ran: list[Ubatch]) -> None:
    for u in ran:
        assert u.weight_matmuls and u.count("MUL_MAT_ID") > 0
        # Each weight matmul runs where the rule puts it. In a wide piece that is the device, but for
        # the last layer's rows after the output selection (only the logit rows go on) and lm_head.
        assert all(dev == (batch >= MIN) for batch, dev in u.weight_matmuls), u.weight_matmuls
        if u.width < MIN:  # a narrow tail: no matmul on the device at all, only per-head elementwise ops
            assert u.count("MUL_MAT", device=True) == u.count("MUL_MAT_ID", device=True) == 0
            assert u.device_weight_ops <= NARROW_TAIL_WEIGHT_OPS, u.device_weight_ops


def expected_dev_tokens(n: int, n_batch: int = 512) -> int:
    return sum(w for w in ubatch_widths(n, n_batch, UBATCH) if w >= MIN)


# --- the gate ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("arch", FULL_ARCHS)
def test_g18g_device_equals_cpu(arch: str, mode: str, open_pair, observed: Observer) -> None:
    dev, cpu = open_pair(arch, mode)
    observed.take()  # whatever the sessions ran while opening
    for i, prefix, suffix in REQUESTS:
        r = DecideRequest(id=i, prefix=prefix, suffix=suffix, choices=ABC)
        a = dev.decide(r)
        ran = observed.take()
        b = cpu.decide(r)
        ran_cpu = observed.take()
        assert a.error is None and b.error is None, (a.error, b.error)
        assert a.reuse == "off" and a.n_reused == 0, "auto keeps no prefix state with a device"
        assert a.scores.choice_logp == b.scores.choice_logp and a.scores.best == b.scores.best
        assert np.array_equal(dev.decider.decider.seq.last_logits(), cpu.decider.decider.seq.last_logits())
        # what ran where, as observed
        widths = ubatch_widths(a.n_tokens, 512, UBATCH)
        assert [u.width for u in ran] == widths and widths[-1] < MIN <= widths[0], "a wide piece and a narrow tail"
        assert [u.on_device for u in ran] == [w >= MIN for w in widths]
        check_placement(ran)
        assert not any(u.device_ops for u in ran_cpu)
        assert a.prefill_dev_tokens == sum(u.width for u in ran if u.on_device) == expected_dev_tokens(a.n_tokens)
        assert b.prefill_dev_tokens is None and "prefill_dev_tokens" not in decide_fields(b)
        assert decide_fields(a)["prefill_dev_tokens"] == a.prefill_dev_tokens
        assert not [w for u in ran for w in u.weights_off_host], "model weights stay in host buffers"

    g = GenerateRequest(prompt=P2 + S3, keep_logits=True)
    ga = dev.generate(g)
    ran = observed.take()
    gb = cpu.generate(g)
    observed.take()
    assert ga.tokens == gb.tokens and len(ga.logits) == len(gb.logits) > 0
    assert all(np.array_equal(x, y) for x, y in zip(ga.logits, gb.logits))
    prompt_widths = ubatch_widths(ga.n_prompt, 512, UBATCH)
    assert [u.width for u in ran[: len(prompt_widths)]] == prompt_widths
    decode = ran[len(prompt_widths) :]
    assert decode and all(u.width == 1 and not u.on_device for u in decode), "decode stays on the CPU"
    assert ga.prefill_dev_tokens == expected_dev_tokens(ga.n_prompt) == sum(u.width for u in ran if u.on_device)
    assert done_fields(ga)["prefill_dev_tokens"] == ga.prefill_dev_tokens
    assert "prefill_dev_tokens" not in done_fields(gb)


def test_g18g_narrow_prompt_stays_on_cpu(open_pair, observed: Observer) -> None:
    dev, cpu = open_pair("qwen3moe", "resident", n_ubatch=MIN - 1, n_batch=MIN - 1)
    observed.take()
    r = DecideRequest(id=1, prefix=P1, suffix=S1, choices=ABC)
    a = dev.decide(r)
    ran = observed.take()
    b = cpu.decide(r)
    assert a.prefill_dev_tokens == 0 and ran and not any(u.on_device for u in ran)
    check_placement(ran)
    assert a.scores.choice_logp == b.scores.choice_logp


# --- startup refusals and the device list ------------------------------------------------
def test_g18g_refusals(tiny_models, rpc) -> None:
    model = tiny_models("qwen3moe", "q8_0")
    with pytest.raises(PrefillDeviceError, match="no device named 'CUDA7'.*RPC0|no device named 'CUDA7'"):
        Session(SessionConfig(model=model, prefill_device="CUDA7"))
    with pytest.raises(PrefillDeviceError, match=f"from {MIN} tokens on, not {MIN + 1}"):
        Session(SessionConfig(model=model, prefill_device=rpc.name, prefill_min_tokens=MIN + 1))
    with pytest.raises(PrefillDeviceError, match="is the host CPU"):
        Session(SessionConfig(model=model, prefill_device="CPU"))
    # on is allowed with a device: the restored state is exact here (test below)
    assert SessionConfig(model=model, prefill_device=rpc.name, decide_prefix_cache="on").decide_prefix_cache == "on"
    with pytest.raises(ConfigError, match="prefill_min_tokens: must be an integer >= 2"):
        SessionConfig(model=model, prefill_device=rpc.name, prefill_min_tokens=1)


def test_g18g_list_devices(rpc, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["--list-devices"]) == 0
    out = capsys.readouterr().out
    assert any(line.split()[:2] == [rpc.name, "gpu"] for line in out.splitlines()), out
    assert f"--prefill-device takes one of: {rpc.name}" in out


def test_g18g_hook_is_guarded_and_stock_rpc_is_refused(tiny_models, rpc) -> None:
    with pytest.raises(rpc_device.HookRefused, match="not an RPC device"):
        rpc_device.install_offload_rule("CPU", MIN)
    model = tiny_models("qwen3moe", "q8_0")
    rpc_device.remove_offload_rule(rpc.name)  # stock RPC: no offload rule
    try:
        assert offload_threshold(rpc.handle) is None
        with pytest.raises(
            PrefillDeviceError, match=f"{rpc.name} \\(RPC\\) never takes ops whose weights stay on the host"
        ):
            Session(SessionConfig(model=model, prefill_device=rpc.name, prefill_min_tokens=MIN))
    finally:
        again = rpc_device.install_offload_rule(rpc.name, MIN)
    assert again.handle == rpc.handle and offload_threshold(again.handle) == MIN


@pytest.mark.parametrize("mode", ["resident", "stream-nocache"])
@pytest.mark.parametrize("arch", FULL_ARCHS)
def test_g18g_restored_prefix_is_exact_with_a_device(arch: str, mode: str, open_pair) -> None:
    """Why --decide-prefix-cache on is allowed with a device (docs/prefill-device.md): in bmoe the
    KV never leaves the host, and a restored prefix scores bit for bit what the same prefix
    computed scores, with the device and against the CPU. The policy is switched on directly so
    the CPU session keeps states the same way."""

    def keeping(s: Session) -> Session:
        s.decider.decider.policy = DecidePolicy(keep_prefix=True)
        return s

    dev, cpu = (keeping(s) for s in open_pair(arch, mode))
    fresh_dev, _ = (keeping(s) for s in open_pair(arch, mode))
    dev.decide(DecideRequest(id=1, prefix=P1, suffix=S1, choices=ABC))
    cpu.decide(DecideRequest(id=1, prefix=P1, suffix=S1, choices=ABC))
    r = DecideRequest(id=2, prefix=P1, suffix=S2, choices=ABC)
    restored, restored_cpu, fresh = dev.decide(r), cpu.decide(r), fresh_dev.decide(r)
    assert (restored.reuse, restored_cpu.reuse, fresh.reuse) == ("restored", "restored", "stored")
    assert restored.n_reused > 0 and restored.prefill_dev_tokens == expected_dev_tokens(
        restored.n_tokens - restored.n_reused
    )
    assert restored.scores.choice_logp == fresh.scores.choice_logp == restored_cpu.scores.choice_logp
    rows = [s.decider.decider.seq.last_logits() for s in (dev, fresh_dev, cpu)]
    assert np.array_equal(rows[0], rows[1]) and np.array_equal(rows[0], rows[2])


@pytest.mark.parametrize("mode", ["resident", "stream-nocache"])
def test_g18g_side_sequences_opened_later_keep_the_device_equal_to_cpu(
    mode: str, open_pair, observed: Observer
) -> None:
    """decide_batch auto: the first full-scored decision re-creates the context with side
    sequences. A streamed device session warms the new context up as it warmed the first (one
    CPU-wide token before the device's first graph), and goes on equal to the CPU session."""
    dev, cpu = open_pair("qwen3moe", mode)
    observed.take()
    r = DecideRequest(id=1, prefix=P1, suffix=S1, choices=ABC)
    assert dev.decide(r).scores == cpu.decide(r).scores
    assert dev.runtime.side_sequences == cpu.runtime.side_sequences == 0
    observed.take()
    full = DecideRequest(id=2, prefix=P1, suffix=S2, choices=("Open Settings", "Call Mom"), scoring="full")
    a = dev.decide(full)
    ran = observed.take()
    b = cpu.decide(full)
    assert a.error is None and b.error is None, (a.error, b.error)
    assert dev.runtime.side_sequences == cpu.runtime.side_sequences == 8
    assert a.scores == b.scores
    widths = [u.width for u in ran]
    warm = [1] if mode != "resident" else []
    assert widths[: len(warm) + 1] == warm + ubatch_widths(a.n_tokens, 512, UBATCH)[:1]
    check_placement(ran[len(warm) :])
    for i, prefix, suffix in REQUESTS:
        q = DecideRequest(id=i, prefix=prefix, suffix=suffix, choices=ABC)
        assert dev.decide(q).scores == cpu.decide(q).scores
    g = GenerateRequest(prompt=P2 + S3, keep_logits=True)
    ga, gb = dev.generate(g), cpu.generate(g)
    assert ga.tokens == gb.tokens and all(np.array_equal(x, y) for x, y in zip(ga.logits, gb.logits))


def test_g18g_cli_session_reports_device_tokens(
    tiny_models, rpc, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The flags end to end: bmoe-cli --session with the device, BMOE_DECIDE and BMOE_DONE lines."""
    import io
    import json

    decide = {"cmd": "decide", "id": 1, "prefix": P1, "suffix": S1, "choices": list(ABC)}
    lines = [json.dumps(decide), json.dumps({"cmd": "generate", "id": 2, "prompt": P2 + S3, "n_predict": 4})]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    argv = [
        "-m",
        str(tiny_models("qwen3moe", "q8_0")),
        "--session",
        "--decide",
        "-c",
        "512",
        "-ub",
        str(UBATCH),
        "-t",
        "2",
        "--prefill-device",
        rpc.name,
        "--prefill-min-tokens",
        str(MIN),
    ]
    assert cli_main(argv) == 0
    out = {
        ln.split(" ", 1)[0]: json.loads(ln.split(" ", 1)[1])
        for ln in capfd.readouterr().out.splitlines()
        if ln.startswith(("BMOE_DECIDE ", "BMOE_DONE "))
    }
    d, g = out["BMOE_DECIDE"], out["BMOE_DONE"]
    assert d["reuse"] == "off" and d["prefill_dev_tokens"] == expected_dev_tokens(d["n_tokens"]) > 0
    assert g["prefill_dev_tokens"] == expected_dev_tokens(g["n_prompt"]) > 0
