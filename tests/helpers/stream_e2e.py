from __future__ import annotations

from pathlib import Path

import llama_cpp  # noqa: E402
import numpy as np

from bmoe.llama.expert_hook import ExpertHook  # noqa: E402
from bmoe.stream import Streamer  # noqa: E402

PROMPT = [1, 17, 42, 99, 3, 250, 7, 64, 128, 300, 5, 77, 1000, 4242]
N_GEN = 10
_plain_cache: dict[Path, tuple[list[int], np.ndarray]] = {}


class Recorder:
    """A streamer wrapper that also records each route's union, for exact expected counts."""

    def __init__(self, inner: Streamer, sabotage: bool = False) -> None:
        self.inner = inner
        self.unions: list[tuple[int, tuple[int, ...]]] = []
        self.ids: list[np.ndarray] = []  # each route's [n_tokens, k] ids, as the router gave them
        self.sabotage = sabotage

    def __getattr__(self, name: str):  # noqa: ANN204 - the rest of StreamerPort (bindings, waits, ...)
        return getattr(self.inner, name)

    def on_route(self, il: int, ids: np.ndarray) -> None:
        self.unions.append((il, tuple(np.unique(ids).tolist())))
        self.ids.append(np.array(ids))
        if not self.sabotage:
            self.inner.on_route(il, ids)


def run(
    path: Path, hook: ExpertHook | None, n_ubatch: int = 512, rcs: list[int] | None = None
) -> tuple[list[int], np.ndarray]:
    """Greedy-generate N_GEN tokens after PROMPT; returns tokens and every step's logits
    (``rcs`` collects each llama_decode's return code)."""
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
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
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
            if rcs is not None:
                rcs.append(rc)
            if hook is not None:
                hook.raise_if_failed()
            assert rc == 0
            pos += len(feed)
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
            rows.append(row)
            tok = int(np.argmax(row))
            tokens.append(tok)
            feed = [tok]
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    return tokens, np.stack(rows)


def plain(path: Path) -> tuple[list[int], np.ndarray]:
    if path not in _plain_cache:
        _plain_cache[path] = run(path, None)
    return _plain_cache[path]
