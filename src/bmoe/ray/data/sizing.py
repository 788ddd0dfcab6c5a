"""What one bmoe actor asks Ray for: CPUs, memory, and optionally one unit of a flash resource.

memory = weights + KV + overhead, from what the model file and the SessionConfig already say:

* weights: resident, every tensor of the file (llama.cpp maps it and reads all of it); streamed
  (``moe_stream``), the dense tensors (``ModelLayout.dense_nbytes``) plus the expert cache budget
  (``cache_mb``; with ``auto``, its ceiling ``cache_ceil_mb``, which must then be set).
* KV: ``n_ctx * sequences * n_layer * n_kv_head * (key_length + value_length) * bytes``, bytes 2
  (f16) or 4 (``kv_f32``), sequences 1, or ``decide_batch + 1`` when decisions are batched (every
  side sequence has its own stream of ``n_ctx`` cells). Every layer is counted as attention, so
  for a hybrid with recurrent layers it is an upper bound.
* overhead: a fixed allowance for llama.cpp's compute buffers, Python and the Ray worker.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bmoe.config import SessionConfig
from bmoe.errors import ConfigError
from bmoe.stream.layout import read_header, read_layout, shard_paths

MIB = 2**20
OVERHEAD_MB = 512  # compute buffers at n_ubatch 512, the Python interpreter with bmoe and Ray's worker


@dataclass(frozen=True, slots=True)
class ActorSizing:
    """One actor's Ray resources, and the parts its memory was added up from (bytes)."""

    num_cpus: float
    memory: int
    resources: dict[str, float]
    weights: int | None  # None (with kv and overhead) when the memory was given, not computed
    kv: int | None
    overhead: int | None

    def describe(self) -> str:
        extra = "".join(f", {k}={v:g}" for k, v in self.resources.items())
        parts = "given" if self.weights is None or self.kv is None or self.overhead is None else \
            f"weights {self.weights / MIB:.0f} + KV {self.kv / MIB:.0f} + overhead {self.overhead / MIB:.0f}"
        return f"num_cpus={self.num_cpus:g}, memory={self.memory / MIB:.0f} MiB ({parts}){extra}"


def _int_field(fields: dict[str, object], key: str) -> int | None:
    v = fields.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def kv_bytes(config: SessionConfig) -> int:
    """The KV cache a session of ``config`` allocates, per the formula in the module doc."""
    fields = read_header(shard_paths(Path(config.model))[0]).fields
    arch = fields.get("general.architecture")
    n_layer = _int_field(fields, f"{arch}.block_count")
    n_head = _int_field(fields, f"{arch}.attention.head_count")
    n_embd = _int_field(fields, f"{arch}.embedding_length")
    if n_layer is None or n_head is None or n_embd is None:
        raise ConfigError(f"model: {config.model} lacks {arch}.block_count, attention.head_count or "
                          "embedding_length; give the actor memory yourself (--actor-memory-mb)")
    # a per-layer list of KV heads is an array the header reader skips: fall back to the query heads
    n_kv_head = _int_field(fields, f"{arch}.attention.head_count_kv") or n_head
    k_len = _int_field(fields, f"{arch}.attention.key_length") or n_embd // n_head
    v_len = _int_field(fields, f"{arch}.attention.value_length") or n_embd // n_head
    sequences = config.decide_batch + 1 if config.decide_batch > 1 else 1
    return config.n_ctx * sequences * n_layer * n_kv_head * (k_len + v_len) * (4 if config.kv_f32 else 2)


def weight_bytes(config: SessionConfig) -> int:
    """RAM the weights hold: the whole file resident; dense part + expert cache budget streamed."""
    if not config.moe_stream:
        return sum(t.nbytes for p in shard_paths(Path(config.model)) for t in read_header(p).tensors)
    if config.cache_mb == "auto":
        if config.cache_ceil_mb <= 0:
            raise ConfigError("cache_mb: auto sizes the cache from the RAM of whichever node the actor lands on; "
                              "for Ray give --cache-mb N, or a ceiling with --cache-ceil-mb, or --actor-memory-mb")
        cache = config.cache_ceil_mb
    else:
        cache = int(config.cache_mb)
    return read_layout(config.model).dense_nbytes + cache * MIB


def actor_sizing(config: SessionConfig, *, num_cpus: float = 1.0, memory_mb: int | None = None,
                 flash_resource: str | None = None) -> ActorSizing:
    """The resources one actor of ``config`` asks for; ``memory_mb`` replaces the computed memory,
    which is then not computed at all (the model need not say what it would take)."""
    if num_cpus <= 0:
        raise ConfigError(f"num_cpus: must be > 0, got {num_cpus}")
    resources = {flash_resource: 1.0} if flash_resource else {}
    if memory_mb is not None:
        return ActorSizing(num_cpus=num_cpus, memory=memory_mb * MIB, resources=resources, weights=None, kv=None,
                           overhead=None)
    weights, kv, overhead = weight_bytes(config), kv_bytes(config), OVERHEAD_MB * MIB
    return ActorSizing(num_cpus=num_cpus, memory=weights + kv + overhead, resources=resources, weights=weights,
                       kv=kv, overhead=overhead)
