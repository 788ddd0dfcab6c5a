"""What a session of a config holds in RAM, from the model file's header alone (no weights loaded).

* weights: resident, every tensor of the file (llama.cpp maps it and reads all of it); streamed,
  the dense tensors (``ModelLayout.dense_nbytes``) plus the most the expert cache can hold
  (``bmoe.stream.budget.most_cache_bytes``: the fixed budget or auto's ceiling, capped at the
  experts' bytes).
* KV: ``n_ctx * sequences * n_layer * n_kv_head * (key_length + value_length) * bytes``, bytes 2
  (f16) or 4 (``kv_f32``); where the query head count is a per-layer list (step35), the sum over
  the layers of each one's KV heads (or query heads) stands for ``n_layer * n_kv_head``. Every
  sequence has its own stream of ``n_ctx`` cells, so each side
  sequence of batched decisions costs one more KV. Every layer is counted as attention, so for a
  hybrid with recurrent layers it is an upper bound.

The Ray actor sizing (``bmoe.ray.data.sizing``, through the session) and the runtime, which opens
side sequences only where their KV fits (``Runtime.open_side_sequences``), both read it here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bmoe.config import SessionConfig
from bmoe.errors import ConfigError
from bmoe.runtime.expert_streaming import stream_settings
from bmoe.stream.budget import most_cache_bytes
from bmoe.stream.layout import read_header, read_layout, shard_paths


@dataclass(frozen=True, slots=True)
class Footprint:
    """Bytes a session of a config holds: its weights and its KV at the most sequences it may open."""

    weights: int
    kv: int


def _int_field(fields: dict[str, object], key: str) -> int | None:
    v = fields.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def kv_bytes_per_sequence(model: Path, n_ctx: int, kv_f32: bool) -> int:
    """The KV one sequence of ``n_ctx`` cells takes, per the formula in the module doc."""
    fields = read_header(shard_paths(Path(model))[0]).fields
    arch = fields.get("general.architecture")
    n_layer = _int_field(fields, f"{arch}.block_count")
    n_head = _int_field(fields, f"{arch}.attention.head_count")
    n_embd = _int_field(fields, f"{arch}.embedding_length")
    if n_head is None and n_layer is not None and n_embd is not None:
        per_layer = _per_layer_kv_heads(fields, arch, n_layer)
        if per_layer is not None:
            n_kv_heads, n_head = per_layer
            k_len = _int_field(fields, f"{arch}.attention.key_length") or n_embd // n_head
            v_len = _int_field(fields, f"{arch}.attention.value_length") or n_embd // n_head
            return n_ctx * n_kv_heads * (k_len + v_len) * (4 if kv_f32 else 2)
    if n_layer is None or n_head is None or n_embd is None:
        raise ConfigError(
            f"model: {model} lacks {arch}.block_count, attention.head_count or embedding_length, "
            "so its KV size is unknown"
        )
    # a per-layer list of KV heads is an array the header reader skips: fall back to the query heads
    n_kv_head = _int_field(fields, f"{arch}.attention.head_count_kv") or n_head
    k_len = _int_field(fields, f"{arch}.attention.key_length") or n_embd // n_head
    v_len = _int_field(fields, f"{arch}.attention.value_length") or n_embd // n_head
    return n_ctx * n_layer * n_kv_head * (k_len + v_len) * (4 if kv_f32 else 2)


def _per_layer_kv_heads(fields: dict[str, object], arch: object, n_layer: int) -> tuple[int, int] | None:
    """(KV heads summed over the trunk's layers, the most query heads of a layer) where the query
    head count is a per-layer list (read_header decodes short integer arrays), else None. The KV
    heads are a scalar or a list too; missing, the query heads stand for them. The lists may run
    past the trunk (NextN blocks): only the first ``n_layer`` entries count."""

    def counts(key: str) -> tuple[int, ...] | None:
        v = fields.get(key)
        if isinstance(v, tuple) and len(v) >= n_layer and all(isinstance(x, int) and x > 0 for x in v[:n_layer]):
            return v[:n_layer]
        n = _int_field(fields, key)
        return None if n is None else (n,) * n_layer

    heads = counts(f"{arch}.attention.head_count")
    if heads is None or not isinstance(fields.get(f"{arch}.attention.head_count"), tuple):
        return None
    kv = counts(f"{arch}.attention.head_count_kv") or heads
    return sum(kv), max(heads)


def kv_bytes(config: SessionConfig) -> int:
    """The KV a session of ``config`` may allocate: one sequence's, times the most sequences it opens."""
    return kv_bytes_per_sequence(config.model, config.n_ctx, config.kv_f32) * config.n_seq_max


def weight_bytes(config: SessionConfig) -> int:
    """RAM the weights hold: the whole file resident; dense part + expert cache streamed."""
    if not config.moe_stream:
        return sum(t.nbytes for p in shard_paths(Path(config.model)) for t in read_header(p).tensors)
    layout = read_layout(config.model)
    cache = most_cache_bytes(stream_settings(config), layout)
    if cache is None:
        raise ConfigError(
            "cache_mb: auto sizes the cache from the RAM of the machine the session opens on; "
            "give --cache-mb N, or a ceiling with --cache-ceil-mb"
        )
    return layout.dense_nbytes + cache


def footprint(config: SessionConfig) -> Footprint:
    """The weights and the KV a session of ``config`` holds at most (see the module doc)."""
    return Footprint(weights=weight_bytes(config), kv=kv_bytes(config))
