"""Decisions on SmolLM2-135M-Instruct with its own chat template.

The Wi-Fi agent of examples/wifi_agent.jsonl runs through the session API, reusing its prefix
where the prefix stays or grows; a whole-prefill decision scores what plain llama.cpp computes for
the same rendered prompt; a refused request leaves the next decision exactly as it would have been.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from bmoe.decide.types import DecideRequest
from bmoe.runtime.chat import Message
from bmoe.session import Session
from bmoe.wire.protocol import Decide, parse_line
from bmoe.wire.records import decide_fields

WIFI_FILE = Path(__file__).resolve().parents[2] / "examples" / "wifi_agent.jsonl"
# What happens to the kept state at each of the four steps: the first stores its prefix, the
# second has the same prefix, the third's history grew, the fourth opts out.
WIFI_REUSE = ["stored", "restored", "restored+stored", "opted out"]


@pytest.fixture(scope="module")
def wifi() -> list[DecideRequest]:
    """The four Wi-Fi agent steps, parsed by the same line parser the CLI session uses."""
    commands = [parse_line(line) for line in WIFI_FILE.read_text().splitlines() if line.strip()]
    requests = [c.request for c in commands if isinstance(c, Decide)]
    assert len(requests) >= 4
    return requests[:4]


def run_wifi(s: Session, wifi: list[DecideRequest]) -> list:
    results = [s.decide(r) for r in wifi]
    assert [r.error for r in results] == [None] * 4
    return results


def test_wifi_agent_reuses_the_kept_prefix(open_smol, wifi) -> None:
    s = open_smol(decide=True)
    first, same, grown, whole = run_wifi(s, wifi)
    assert [r.reuse for r in (first, same, grown, whole)] == WIFI_REUSE
    assert first.n_reused == 0 and whole.n_reused == 0
    assert same.n_reused > 0 and grown.n_reused > 0
    # The grown prefix restores the state kept at step 1 (the same prefix as step 2), then keeps
    # its own, longer one.
    assert grown.n_reused == same.n_reused
    # SmolLM2's memory is attention only: the kept state stays in the sequence, uncopied, until
    # the opted-out step is about to overwrite it; that step copies it out (its store_s).
    assert first.prefix_state_mib == same.prefix_state_mib == grown.prefix_state_mib == 0
    assert whole.prefix_state_mib > 0 and whole.store_s > 0
    assert whole.n_tokens == grown.n_tokens
    assert same.restore_s > 0 and same.store_s == 0
    assert grown.restore_s > 0 and grown.store_s >= 0
    assert first.restore_s == 0 and first.store_s >= 0
    # The copy restores what the grown step computed, bit for bit, and the sequence then holds
    # the kept state again.
    again = s.decide(wifi[2])
    assert again.reuse == "restored" and again.n_reused > grown.n_reused
    assert again.scores == grown.scores and again.prefix_state_mib == whole.prefix_state_mib
    # The restored tokens lie inside the prefix: they read as the start of the prefix rendered alone.
    for r, req in ((same, wifi[1]), (grown, wifi[2])):
        tokens = s.tokenize_prompt(s.render([Message("user", req.prefix + req.suffix)], think=False))
        assert len(tokens) == r.n_tokens and r.n_reused < r.n_tokens
        restored_text = s.model.detokenize(tokens[: r.n_reused], special=True)
        assert s.render([Message("user", req.prefix)], think=False).startswith(restored_text)
    for r in (first, same, grown, whole):
        assert r.scores is not None and len(r.scores.choice_logp) == 3
        assert r.scores.best == int(np.argmax(r.scores.choice_logp))
        assert 0.0 <= r.scores.p_outside <= 1.0


def test_restored_prefix_scores_what_a_fresh_session_computes(open_smol, wifi) -> None:
    a = open_smol(decide=True)
    a.decide(wifi[0])
    restored = a.decide(wifi[1])
    fresh = open_smol(decide=True).decide(wifi[1])
    assert (restored.reuse, fresh.reuse) == ("restored", "stored")
    assert restored.scores == fresh.scores  # bit for bit: the same pieces over the same state


def _tokenize(vocab: object, text: str, *, specials: bool) -> list[int]:
    data = text.encode("utf-8")
    buf = (llama_cpp.llama_token * (len(data) + 8))()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), specials, specials)
    assert n >= 0
    return list(buf[:n])


def plain_llama_cpp(
    model_path: Path, text: str, choices: tuple[str, ...], s: Session
) -> tuple[list[int], np.ndarray, list[int]]:
    """What llama.cpp alone computes for ``text``, prefilled whole in one llama_decode in a context
    shaped like the session's (batch sizes, threads, flash attention, KV type) over weights loaded
    as bmoe loads them (no repacking, so the same kernels): the prompt's tokens, the last row's
    log-softmax in float64, and each choice's first token (the bare label tokenized without
    specials)."""
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.use_extra_bufts = False  # as bmoe loads it: no repacked weights, so the same matmul kernels
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), mp)
    assert model
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        tokens = _tokenize(vocab, text, specials=True)  # BOS as the model's metadata asks
        firsts = [_tokenize(vocab, c, specials=False)[0] for c in choices]
        n = len(tokens)
        assert 0 < n <= s.config.n_ubatch  # one ubatch: one graph computes the row
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = s.config.n_ctx
        cp.n_batch = s.config.n_batch
        cp.n_ubatch = s.config.n_ubatch
        cp.n_threads = cp.n_threads_batch = s.config.threads
        cp.flash_attn_type = {
            None: llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
            True: llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            False: llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        }[s.config.flash_attn]
        if s.config.kv_f32:
            cp.type_k = cp.type_v = llama_cpp.GGML_TYPE_F32
        ctx = llama_cpp.llama_init_from_model(model, cp)
        assert ctx
        # Filled by hand: the batch owns its arrays, so nothing is freed under llama_decode.
        batch = llama_cpp.llama_batch_init(n, 0, 1)
        try:
            batch.n_tokens = n
            for i, tok in enumerate(tokens):
                batch.token[i] = tok
                batch.pos[i] = i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1 if i == n - 1 else 0
            assert llama_cpp.llama_decode(ctx, batch) == 0
            n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, n - 1), shape=(n_vocab,))
            row = row.astype(np.float64)  # a copy, made before the context goes
        finally:
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)
    finally:
        llama_cpp.llama_model_free(model)
    shifted = row - row.max()
    return tokens, shifted - np.log(np.exp(shifted).sum()), firsts


def test_whole_prefill_equals_plain_llama_cpp(open_smol, smollm2_path, wifi) -> None:
    s = open_smol(decide=True)
    whole = run_wifi(s, wifi)[3]  # after restores and stores: opting out must still start clean
    assert whole.reuse == "opted out" and whole.scores is not None
    req = wifi[3]
    text = s.render([Message("user", req.prefix + req.suffix)], think=False)
    assert text.startswith("<|im_start|>system\n")  # SmolLM2's own template, with its system turn
    tokens, logp, firsts = plain_llama_cpp(smollm2_path, text, req.choices, s)
    assert len(tokens) == whole.n_tokens and tokens == s.tokenize_prompt(text)
    np.testing.assert_allclose(whole.scores.choice_logp, logp[firsts], rtol=0, atol=1e-5)


COLLIDING = ("Network", "Display", "Bluetooth", "Battery")
COLLISION_ERROR = (
    "decide: choices 2 ('Bluetooth') and 3 ('Battery') both start with token 50 ('B'); a choice "
    "is scored by its first token, so they cannot be told apart: give labels that start "
    "differently (A, B, C, ...)"
)


def test_colliding_choices_are_refused_and_change_nothing(open_smol, wifi) -> None:
    s = open_smol(decide=True)
    first = s.decide(wifi[0])
    kv_tokens = list(s.kv.tokens)
    bad = DecideRequest(id=7, prefix=wifi[1].prefix, suffix=wifi[1].suffix, choices=COLLIDING)
    refused = s.decide(bad)
    assert refused.error == COLLISION_ERROR and refused.refused and refused.scores is None
    assert decide_fields(refused) == {"id": 7, "error": COLLISION_ERROR}
    assert s.kv.tokens == kv_tokens and s.decider.decider.seq.held_bytes / 2**20 == first.prefix_state_mib
    after = s.decide(wifi[1])
    ref = open_smol(decide=True)
    ref.decide(wifi[0])
    expected = ref.decide(wifi[1])
    assert after.reuse == expected.reuse == "restored"
    assert after.n_reused == expected.n_reused > 0 and after.n_tokens == expected.n_tokens
    assert after.scores == expected.scores


def test_prompts_tokenized_together_equal_one_by_one(open_smol, wifi) -> None:
    """The adapter tokenizes a decision's two renderings concurrently; order and ids must not change."""
    s = open_smol(decide=True)
    texts = [s.render([Message("user", r.prefix + r.suffix)], think=False) for r in wifi]
    texts += [s.render([Message("user", r.prefix)], think=False) for r in wifi]
    assert s.decider.decider.text.tokenize_prompts(texts) == [s.tokenize_prompt(t) for t in texts]
