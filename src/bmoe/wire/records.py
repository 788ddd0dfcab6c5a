"""BMOE_* machine lines: `BMOE_<TAG> <one JSON object>` on stdout.

docs/telemetry.md is the contract for every key here; keys kept from BigMoeOnEdge's
protocol keep their names and meanings, added keys are documented as bmoe's own.
"""

from __future__ import annotations

import json
import math

from bmoe.decide.types import DecideResult
from bmoe.runtime.results import GenerateResult, Step

JsonValue = None | bool | int | float | str | list[float] | list[int] | list[list[float]]

MIB = 2**20


def line(tag: str, obj: dict) -> str:
    return f"BMOE_{tag} " + json_object(obj)


def json_object(obj: dict) -> str:
    """The JSON of a BMOE_* line, on one line (also ``bmoe-cli -p --json``'s stdout)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (e.g. an undecodable byte of a path): escape it
        text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return text


def _r(x: float, nd: int = 4) -> float:
    return round(float(x), nd) if math.isfinite(x) else 0.0


def ready(
    *,
    load_s: float,
    arch: str,
    n_ctx: int,
    think_ctl: str,
    n_expert_used: int,
    model: str,
    streaming: bool,
    decide: bool,
    load_read_mib: float,
    dense_weights: str | None = None,
    dense_anon_mib: float = 0.0,
    n_expert_used_gguf: int | None = None,
    plan: dict | None = None,
) -> str:
    """``n_expert_used`` is what llama.cpp routes (after --n-expert-used), ``n_expert_used_gguf``
    the model file's own number (None: the same); ``plan`` the plan's JSON (None: plan off)."""
    return line(
        "READY",
        {
            "load_s": _r(load_s),
            "arch": arch,
            "n_ctx": n_ctx,
            "think_ctl": think_ctl,
            "n_expert_used": n_expert_used,
            "model": model,
            "streaming": streaming,
            "decide": decide,
            "load_read_mib": _r(load_read_mib, 2),
            "dense_weights": dense_weights,
            "dense_anon_mib": _r(dense_anon_mib, 2),
            "n_expert_used_gguf": n_expert_used if n_expert_used_gguf is None else n_expert_used_gguf,
            "plan": plan,
        },
    )


def begin(rid: int) -> str:
    return line("BEGIN", {"id": rid})


def load(step: Step) -> str:
    return line("LOAD", {"mb": _r(step.read_mb, 3), "ms": _r(step.io_ms, 3)})


def step_lines(step: Step, steps: int, dense_resident_frac: float) -> list[str]:
    """What a generated token sends: BMOE_LOAD when its experts were read, then BMOE_PROGRESS."""
    return ([load(step)] if step.read_mb > 0 else []) + [progress(step, steps, dense_resident_frac)]


def progress(step: Step, steps: int, dense_resident_frac: float) -> str:
    return line(
        "PROGRESS",
        {
            "step": step.index + 1,
            "steps": steps,
            "wall_ms": _r(step.wall_ms, 3),
            "io_ms": _r(step.io_ms, 3),
            "compute_ms": _r(step.compute_ms, 3),
            "mgmt_ms": _r(step.mgmt_ms, 3),
            "stall_ms": _r(step.stall_ms, 3),
            "read_mb": _r(step.read_mb, 3),
            "cache_hit_pct": _r(step.cache_hit_pct, 2),
            "majflt": step.majflt,
            "cpu_ms": _r(step.cpu_ms, 3),
            "dense_resident_frac": _r(dense_resident_frac, 4),
            "delta_text": step.delta_text,
            "delta_reasoning": step.delta_reasoning,
        },
    )


def done_fields(r: GenerateResult) -> dict:
    n = max(1, r.n_tokens)
    io, dec = r.io, r.decode_io  # the request's counters; the decode steps' part of them
    tok = r.decode_split.per(n)  # mgmt and stall per token, capped as BMOE_PROGRESS caps them
    return {
        "id": r.id,
        "cancelled": r.cancelled,
        "tokens": r.n_tokens,
        "tok_s": _r(r.tok_s, 3),
        "prefill_s": _r(r.prefill_s),
        "prefill_tps": _r(r.prefill_tps, 2),
        "load_s": _r(r.load_s),
        "cache_hit_pct": _r(io.hit_pct, 2),
        "n_prompt": r.n_prompt,
        "n_past": r.n_past,
        "compute_s_tok": _r(max(0.0, tok.wall_s - dec.io_s / n - tok.mgmt_s), 6),
        "io_s_tok": _r(dec.io_s / n, 6),
        "cache_resident_mib": _r(io.resident_bytes / MIB, 2),
        "cache_budget_mib": _r(io.budget_bytes / MIB, 2),
        "read_mib": _r(io.read_bytes / MIB, 3),
        "stall_s_tok": _r(tok.stall_s, 6),
        "mgmt_s_tok": _r(tok.mgmt_s, 6),
        "majflt_tok": _r(r.majflt / n, 3),
        "cpu_s_tok": _r(r.cpu_s / n, 6),
        "reasoning": r.reasoning,
        "text": r.text,
        # bmoe's own keys
        "n_reused": r.n_reused,
        "prefill_fallback": r.prefill_fallback,
        # only when the turn restored a kept state from the state store
        **({"reuse_tier": r.reuse_tier, "restore_s": _r(r.restore_s)} if r.reuse_tier else {}),
        "stop": r.stop,
        "experts_routed": io.routed,
        "read_mib_tok": _r(io.read_bytes / MIB / n, 3),
        "read_gbps": _r(io.read_bytes / io.io_s / 1e9, 3) if io.io_s > 0 else 0.0,
        # only with --prefetch, once something was guessed
        **(
            {"prefetch_hit_pct": _r(io.prefetch_hit_pct, 2), "wasted_mib": _r(io.wasted_bytes / MIB, 3)}
            if io.prefetch_hit_pct is not None
            else {}
        ),
        # only with a prefill device, as BMOE_DECIDE reports it
        **({"prefill_dev_tokens": r.prefill_dev_tokens} if r.prefill_dev_tokens is not None else {}),
    }


def done(r: GenerateResult) -> str:
    return line("DONE", done_fields(r))


def decide_fields(r: DecideResult) -> dict[str, JsonValue]:
    """The BMOE_DECIDE object (also /v1/decide's body): ``{"id", "error"}`` for a refused or
    failed request, every key otherwise."""
    if r.error is not None or r.scores is None:
        return {"id": r.id, "error": r.error}
    out: dict[str, JsonValue] = {
        "id": r.id,
        "best": r.scores.best,
        "choice_logp": list(r.scores.choice_logp),
        "p_outside": r.scores.p_outside,
        "abstained": r.scores.abstained,
        "scoring": r.scores.scoring,
        "best_by": r.scores.best_by,
    }
    out.update(_full_scores(r))
    out.update(_debias(r))
    out |= {
        "n_tokens": r.n_tokens,
        "n_reused": r.n_reused,
        "prefill_s": r.prefill_s,
        "prefill_tps": r.prefill_tps,
    }
    # Streaming and prefill-device counters appear only where they mean something.
    if r.read_mb is not None:
        out["read_mb"] = r.read_mb
    if r.cache_hit_pct is not None:
        out["cache_hit_pct"] = r.cache_hit_pct
    if r.prefill_dev_tokens is not None:
        out["prefill_dev_tokens"] = r.prefill_dev_tokens
    out["prefix_state_mib"] = r.prefix_state_mib
    out["store_s"] = r.store_s
    out["restore_s"] = r.restore_s
    out["reuse"] = r.reuse
    if r.reuse_tier:  # a kept state was restored: from which tier of the store
        out["reuse_tier"] = r.reuse_tier
    if r.scores.scoring == "full":  # what scoring the choices cost beyond the prompt
        out["score_tokens"] = r.score_tokens
        out["score_s"] = r.score_s
        if r.score_read_mb is not None:
            out["score_read_mb"] = r.score_read_mb
        if r.uncond_reuse is not None:
            out["uncond_reuse"] = r.uncond_reuse
            out["uncond_state_mib"] = r.uncond_state_mib
    if r.batch is not None:  # prefilled together with other decisions: the batch as a whole
        out["batch_id"] = r.batch.id
        out["batch_size"] = r.batch.size
        out["batch_tokens"] = r.batch.n_tokens
        out["batch_prefill_s"] = r.batch.prefill_s
        if r.batch.read_mb is not None:
            out["batch_read_mb"] = r.batch.read_mb
    return out


def _full_scores(r: DecideResult) -> dict[str, JsonValue]:
    """The per-choice keys of scoring "full" (none under "first"); the neutral prompt's two only
    when the choices were scored after one."""
    sc = r.scores
    if sc is None or sc.scoring != "full":
        return {}
    out: dict[str, JsonValue] = {
        "choice_tokens": list(sc.choice_tokens or ()),
        "choice_logp_mean": list(sc.choice_logp_mean or ()),
        "choice_logp_norm": list(sc.choice_logp_norm or ()),
        "choice_token_logp": [list(t) for t in sc.choice_token_logp or ()],
    }
    if sc.choice_logp_neutral is not None and sc.choice_logp_uncond is not None:
        out["choice_logp_neutral"] = list(sc.choice_logp_neutral)
        out["choice_logp_uncond"] = list(sc.choice_logp_uncond)
    return out


def _debias(r: DecideResult) -> dict[str, JsonValue]:
    """Order debiasing's keys (none without "debias"): docs/decide.md "Order debiasing"."""
    d = r.debias
    if d is None:
        return {}
    out: dict[str, JsonValue] = {"debias": d.mode, "debiased_p": list(d.debiased_p), "best_raw": d.best_raw}
    if d.prior is not None:
        out["prior"] = list(d.prior)
    if d.stage is not None:
        out["pride_stage"] = d.stage
        out["prior_samples"] = d.prior_samples
    out["debias_decisions"] = d.decisions
    out["debias_prefill_s"] = d.prefill_s
    return out


def decide(r: DecideResult) -> str:
    return line("DECIDE", decide_fields(r))


def error(rid: int | None, msg: str, *, fatal: bool) -> str:
    return line("ERROR", {"id": rid, "fatal": fatal, "msg": msg})


def summary(r: GenerateResult) -> str:
    """The one-shot perf summary for people."""
    io, dec = r.io, r.decode_io
    n = max(1, r.n_tokens)
    tok = r.decode_split.per(n)
    out = [
        f"prefill: {r.n_prompt} tokens in {r.prefill_s:.3f} s ({r.prefill_tps:.1f} tok/s)",
        f"generation: {r.n_tokens} tokens in {r.decode_s:.3f} s ({r.tok_s:.2f} tok/s)",
    ]
    if io.routed or io.read_bytes:
        bw = io.read_bytes / io.io_s / 1e9 if io.io_s > 0 else 0.0
        out.append(
            f"flash read: {io.read_bytes / MIB:.1f} MiB ({dec.read_bytes / MIB / n:.2f} MiB per decode token), "
            f"{io.routed} experts routed"
        )
        # per decode token: the decode steps' own counters (the prefill's reads and waits are not
        # per-token figures; counting them here made "waiting" exceed the token's wall time), and
        # compute + cache mgmt + waiting add up to the token's wall time (TimeSplit)
        out.append(
            f"per token: {tok.wall_s * 1e3:.2f} ms = compute {tok.compute_s * 1e3:.2f} ms + "
            f"cache mgmt {tok.mgmt_s * 1e3:.2f} ms + waiting for flash {tok.stall_s * 1e3:.2f} ms; "
            f"flash I/O in flight {dec.io_s / n * 1e3:.2f} ms ({bw:.2f} GB/s)"
        )
        if io.guessed:
            out.append(
                f"prefetch: {io.guessed} experts guessed, {100.0 * io.guess_hits / io.guessed:.1f}% picked by "
                f"the router, {io.wasted_bytes / MIB:.1f} MiB read for wrong guesses (in the flash read)"
            )
        hit = f"{io.hit_pct:.1f}%" if io.cache_on else "off"
        out.append(
            f"expert cache: hit rate {hit}, resident {io.resident_bytes / MIB:.1f} MiB "
            f"of {io.budget_bytes / MIB:.1f} MiB"
        )
    return "\n".join(out)
