"""End to end on a tiny random qwen3moe: streamed == resident, bit for bit, with exact byte counts.

The fixture is this file's own small writer (bmoe.testing's tiny models replace it when they
land). Expert tensors are Q8_0 with slices of 6528 bytes, so no slice is page aligned and the
O_DIRECT head/tail paths are exercised (the tmp dir may be tmpfs: then the fallback is).
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import gguf
import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from bmoe.llama.expert_hook import ExpertHook  # noqa: E402
from bmoe.stream import StreamOptions, Streamer, lookup, read_layout  # noqa: E402
from bmoe.stream.options import Budget  # noqa: E402

N_VOCAB, N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM = 512, 64, 3, 2, 1, 32
N_EXPERT, N_USED, N_FF = 8, 2, 96
PROMPT = [1, 17, 42, 99, 3, 250, 7, 64, 128, 300, 5, 77]
N_GEN = 12


def _tokenizer(w: gguf.GGUFWriter) -> None:
    # A byte-level vocabulary is enough: the tests feed token ids, never text.
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([f"<t{i}>" for i in range(N_VOCAB)])
    w.add_token_types([1] * N_VOCAB)
    w.add_token_merges(["<t 1>"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def write_tiny_qwen3moe(path: Path, seed: int = 0, expert_type: str = "q8_0") -> Path:
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_context_length(256)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_USED)
    w.add_expert_feed_forward_length(N_FF)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if expert_type == "q8_0" else gguf.LlamaFileType.ALL_F32)
    _tokenizer(w)

    def f32(name: str, *shape: int, std: float = 0.2) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * std).astype(np.float32))

    def experts(name: str, *shape: int) -> None:
        x = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        if expert_type == "q8_0":
            q = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, x)

    f32("token_embd.weight", N_VOCAB, N_EMBD, std=1.0)
    f32("output_norm.weight", N_EMBD, std=0.1)
    for il in range(N_LAYER):
        p = f"blk.{il}."
        f32(p + "attn_norm.weight", N_EMBD)
        f32(p + "attn_q.weight", N_HEAD * HEAD_DIM, N_EMBD)
        f32(p + "attn_k.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
        f32(p + "attn_v.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
        f32(p + "attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM)
        f32(p + "attn_q_norm.weight", HEAD_DIM)
        f32(p + "attn_k_norm.weight", HEAD_DIM)
        f32(p + "ffn_norm.weight", N_EMBD)
        f32(p + "ffn_gate_inp.weight", N_EXPERT, N_EMBD, std=1.0)  # strong router: routes vary
        experts(p + "ffn_gate_exps.weight", N_EXPERT, N_FF, N_EMBD)
        experts(p + "ffn_up_exps.weight", N_EXPERT, N_FF, N_EMBD)
        experts(p + "ffn_down_exps.weight", N_EXPERT, N_EMBD, N_FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_qwen3moe(tmp_path_factory.mktemp("tiny") / "tiny-qwen3moe-q8_0.gguf")


class Recorder:
    """A streamer wrapper that also records each route's union, for exact expected counts."""

    def __init__(self, inner: Streamer, sabotage: bool = False) -> None:
        self.inner = inner
        self.unions: list[tuple[int, tuple[int, ...]]] = []
        self.sabotage = sabotage

    def binding(self, name: str):  # noqa: ANN201 - StreamerPort
        return self.inner.binding(name)

    def on_route(self, il: int, ids: np.ndarray) -> None:
        self.unions.append((il, tuple(np.unique(ids).tolist())))
        if not self.sabotage:
            self.inner.on_route(il, ids)


def run(path: Path, hook: ExpertHook | None, n_ubatch: int = 512) -> tuple[list[int], np.ndarray]:
    """Greedy-generate N_GEN tokens after PROMPT; returns tokens and every step's logits."""
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP
    mp.use_extra_bufts = False
    mp.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
    assert model
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 128, 64, n_ubatch, 2, 2
    cp.no_perf = True
    if hook is not None:
        cp.cb_eval = hook.c_callback
        cp.cb_eval_user_data = None
        cp.abort_callback = hook.c_abort_callback
    ctx = llama_cpp.llama_init_from_model(model, cp)
    assert ctx
    batch = llama_cpp.llama_batch_init(64, 0, 1)
    tokens: list[int] = []
    rows = []
    try:
        feed, pos = list(PROMPT), 0
        for _ in range(N_GEN):
            batch.n_tokens = len(feed)
            for i, tok in enumerate(feed):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos + i, 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = i == len(feed) - 1
            rc = llama_cpp.llama_decode(ctx, batch)
            if hook is not None:
                hook.raise_if_failed()
            assert rc == 0
            pos += len(feed)
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(N_VOCAB,)).copy()
            rows.append(row)
            tok = int(np.argmax(row))
            tokens.append(tok)
            feed = [tok]
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    return tokens, np.stack(rows)


@pytest.fixture(scope="module")
def plain(tiny: Path) -> tuple[list[int], np.ndarray]:
    return run(tiny, None)


def _streamed(tiny: Path, budget: Budget, **opts: object) -> tuple[list[int], np.ndarray, Streamer, Recorder, ExpertHook]:
    layout = read_layout(tiny)
    streamer = Streamer(layout, StreamOptions(**opts), budget=budget, warn=lambda m: None)
    rec = Recorder(streamer)
    hook = ExpertHook(rec, lookup(layout.arch))
    tokens, logits = run(tiny, hook)
    return tokens, logits, streamer, rec, hook


def test_cache_off_is_bit_identical_and_reads_exactly_the_routed_slices(tiny: Path, plain) -> None:
    layout = read_layout(tiny)
    tokens, logits, streamer, rec, hook = _streamed(tiny, Budget(0, layout.floor_bytes(), "off"))
    try:
        assert tokens == plain[0]
        assert np.array_equal(logits, plain[1])  # bit for bit, not allclose
        assert len(hook.bound) == N_LAYER * 3  # every expert tensor now points at bmoe's buffers
        per_expert = layout.expert_nbytes_in_layer(0)
        assert per_expert == 3 * (N_EMBD * N_FF // 32 * 34)
        routed = sum(len(u) for _, u in rec.unions)
        s = streamer.stats()
        assert len(rec.unions) == N_GEN * N_LAYER  # one route per layer per ubatch
        assert s.routed == routed and s.misses == routed and s.hits == 0
        assert s.read_bytes == routed * per_expert
        assert len(rec.unions[0][1]) > N_USED  # the prompt's ubatch reads its union once
    finally:
        streamer.close()


def test_evicting_lru_is_bit_identical(tiny: Path, plain) -> None:
    layout = read_layout(tiny)
    budget = layout.floor_bytes() + layout.expert_nbytes_in_layer(0)  # floor + 1 expert: evicts every token
    tokens, logits, streamer, rec, hook = _streamed(tiny, Budget(budget, layout.floor_bytes(), "fixed"),
                                                    io_threads=3)
    try:
        assert tokens == plain[0]
        assert np.array_equal(logits, plain[1])
        s = streamer.stats()
        assert s.hits + s.misses == s.routed == sum(len(u) for _, u in rec.unions)
        assert s.evictions > 0 and s.hits > 0
        assert s.read_bytes == s.misses * layout.expert_nbytes_in_layer(0)
        assert s.resident_bytes <= s.budget_bytes
    finally:
        streamer.close()


def test_sabotaged_streamer_changes_logits(tiny: Path, plain) -> None:
    """Proof that the matmuls read bmoe's buffers: if nothing is read, the output changes."""
    layout = read_layout(tiny)
    streamer = Streamer(layout, StreamOptions(), budget=Budget(0, 0, "off"), warn=lambda m: None)
    hook = ExpertHook(Recorder(streamer, sabotage=True), lookup(layout.arch))
    try:
        _, logits = run(tiny, hook)
        assert not np.array_equal(logits, plain[1])
    finally:
        streamer.close()


def test_read_error_is_sticky_and_aborts_decode(tiny: Path) -> None:
    layout = read_layout(tiny)
    streamer = Streamer(layout, StreamOptions(), budget=Budget(0, 0, "off"), warn=lambda m: None)
    hook = ExpertHook(streamer, lookup(layout.arch))
    tiny.touch()  # same bytes, new mtime: the file "changed under the session"
    try:
        with pytest.raises(Exception, match="changed while streaming"):
            run(tiny, hook)
        assert hook.error is not None and streamer.error is not None
        with pytest.raises(Exception, match="changed while streaming"):
            streamer.on_route(0, np.array([[0, 1]]))
    finally:
        streamer.close()
