"""What the plan starts from (docs/plan.md): the machine (memory the process may still allocate,
its cgroup limit, its cores) and the model as its GGUF header tells it, with no weights loaded
(bytes of the file, of its dense part and of its experts; what sizes the KV and the compute
buffers)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from bmoe.config import SessionConfig
from bmoe.runtime.footprint import kv_bytes_per_sequence
from bmoe.stream import lookup
from bmoe.stream.archs import NothingToStreamError, UnsupportedArchError
from bmoe.stream.budget import available_bytes, cgroup_memory
from bmoe.stream.layout import ModelLayout, read_header, read_layout, shard_paths


@dataclass(frozen=True, slots=True)
class Machine:
    """What the process may use: memory it may still allocate, its memory limit, its cores."""

    available: int
    limit: int | None  # the memory cgroup's limit (None: none)
    cores: int

    @staticmethod
    def here() -> "Machine":
        cg = cgroup_memory()
        return Machine(available=available_bytes(), limit=cg[0] if cg else None, cores=usable_cores())


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What the header tells the plan: bytes of the file, its dense part and its experts, one
    token's routed experts, and what sizes the KV and the compute buffers."""

    file_bytes: int
    dense_bytes: int
    expert_bytes: int  # 0: a dense model (nothing to stream)
    token_bytes: int  # one token's routed experts (the cache's floor)
    layer_bytes: int  # the largest layer's experts: what one set of the cache-off buffers fills up to
    kv_bytes: int  # the KV of the sequences the session opens with
    mmproj_bytes: int  # the vision projector (--mmproj), held resident beside the model
    n_vocab: int
    n_embd: int
    n_head: int
    n_ff_active: int  # FFN width a token runs through (experts used x their width, or the dense FFN)
    n_outputs: int  # logit rows a ubatch asks for at most in a decision (one per sequence)
    why_not_streamed: str  # "" when its experts can stream, else why not
    can_prefetch: bool
    layout: ModelLayout | None  # where its experts lie (None: they cannot stream)


def _int(fields_: dict[str, object], key: str) -> int:
    v = fields_.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def model_facts(config: SessionConfig) -> ModelFacts:
    paths = shard_paths(Path(config.model))
    headers = [read_header(p) for p in paths]
    fields_ = headers[0].fields
    arch = str(fields_.get("general.architecture", ""))
    tensors = [t for h in headers for t in h.tensors]
    file_bytes = sum(t.nbytes for t in tensors)
    embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
    n_embd = _int(fields_, f"{arch}.embedding_length") or (embd.ne[0] if embd else 0)
    n_vocab = embd.ne[1] if embd is not None and len(embd.ne) > 1 else 0
    kv = kv_bytes_per_sequence(config.model, config.n_ctx, config.kv_f32) * config.n_seq_at_open
    why_not_streamed, can_prefetch, layout = "", False, None
    try:
        layout = read_layout(config.model)
        if config.n_expert_used is not None and 1 <= config.n_expert_used <= layout.n_expert:
            layout = layout.with_n_expert_used(config.n_expert_used)
        can_prefetch = lookup(layout.arch).can_prefetch
    except NothingToStreamError:
        why_not_streamed = "a dense model: it has no experts to stream"
    except UnsupportedArchError:
        why_not_streamed = f"expert streaming does not support architecture '{arch}'"
    mmproj = Path(config.mmproj).stat().st_size if config.mmproj is not None else 0
    return ModelFacts(
        mmproj_bytes=mmproj,
        file_bytes=file_bytes,
        dense_bytes=layout.dense_nbytes if layout else file_bytes,
        expert_bytes=layout.expert_nbytes if layout else 0,
        token_bytes=layout.floor_bytes() if layout else 0,
        layer_bytes=max((layout.n_expert * layout.expert_nbytes_in_layer(il) for il in layout.layers), default=0)
        if layout
        else 0,
        kv_bytes=kv,
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_head=_int(fields_, f"{arch}.attention.head_count"),
        n_ff_active=(
            layout.n_expert_used * (_int(fields_, f"{arch}.expert_feed_forward_length") or n_embd)
            if layout
            else _int(fields_, f"{arch}.feed_forward_length") or 4 * n_embd
        ),
        n_outputs=config.n_seq_max,
        why_not_streamed=why_not_streamed,
        can_prefetch=can_prefetch,
        layout=layout,
    )


def compute_bytes(m: ModelFacts, n_ubatch: int, n_ctx: int, flash_attn: bool | None = None) -> int:
    """An estimate of llama.cpp's compute buffers for ubatches of ``n_ubatch`` tokens, from above:
    per token a few rows of the width and of the FFN a token runs (gate, up and their product),
    the logit rows of one output per sequence, and, with flash attention off, one layer's
    attention scores over the whole context (flash attention, which ``None`` lets llama.cpp turn
    on for the CPU's kernels, computes them in tiles). Measured on the bench model's shapes
    (width 2048, 8 experts of 768 used): llama.cpp reserves 208 KiB a token with flash attention
    whatever the context, and this counts 216. A request that keeps every row's logits
    (perplexity, scoring) grows llama.cpp's output buffer beyond this."""
    scores = n_ubatch * n_ctx * max(1, m.n_head) * 4 if flash_attn is False else 0
    return n_ubatch * 4 * (18 * m.n_embd + 3 * m.n_ff_active) + scores + m.n_outputs * m.n_vocab * 4
