"""G37: a prefix state restored from the state store's RAM or flash tier answers bit for bit what
the same prefix computed answers, on one architecture of the attention, MLA, hybrid (DeltaNet) and
recurrent-hybrid (Mamba) families, resident and streamed (docs/decide.md "The state store")."""

from pathlib import Path

import numpy as np
import pytest

from bmoe.decide.types import DecideRequest
from helpers.decide_prompts import ABC, MODES, P1, S1, S2, S3

FAMILIES = ["qwen3moe", "deepseek2", "qwen35moe", "jamba"]
Q1 = "You control a phone. Task: call Mom on speaker. History:"


def req(i: int, prefix: str, suffix: str) -> DecideRequest:
    return DecideRequest(id=i, prefix=prefix, suffix=suffix, choices=ABC)


def logits_of(s) -> np.ndarray:
    return s.decider.decider.seq.last_logits().copy()


def same_as_computed(opener, answer, holder=None) -> None:
    """A session without a store decides P1 then P1 + S2, computing the state ``answer`` restored:
    the scores are bit for bit the restored ones, and where ``holder`` (the restoring session) is
    given, so is the logit row its sequence ends on."""
    b = opener()
    b.decide(req(1, P1, S1))
    computed = b.decide(req(2, P1, S2))
    assert answer.scores.choice_logp == computed.scores.choice_logp
    if holder is not None:
        assert np.array_equal(logits_of(holder), logits_of(b))


@pytest.fixture(params=[(a, m) for a in FAMILIES for m in ("resident", "stream-nocache")], ids=lambda p: "-".join(p))
def opener(request, tiny_models, open_session, tmp_path: Path):
    arch, mode = request.param
    model = tiny_models(arch, "q8_0")

    def _open(**kw):
        return open_session(model, decide=True, **MODES[mode], **kw)

    return _open


def store_kw(tmp_path: Path) -> dict:
    return {"state_ram_mib": 64, "state_disk_mib": 64, "state_dir": tmp_path / "states"}


def test_g37a_interleaved_agents_each_restore_their_own_state_from_ram(opener, tmp_path: Path) -> None:
    a = opener(**store_kw(tmp_path))
    a.decide(req(1, P1, S1))
    other = a.decide(req(2, Q1, S1))  # another agent in between
    restored = a.decide(req(3, P1, S2))
    assert other.reuse.startswith("miss: prefix differs at token ")
    assert (restored.reuse, restored.reuse_tier) == ("restored", "ram") and restored.n_reused > 0
    same_as_computed(opener, restored, a)
    counts = a.state_counts()
    assert counts is not None and (counts.hits_ram, counts.misses, counts.states_ram) == (1, 2, 2)


def test_g37b_a_state_restored_from_flash_after_a_restart_is_exact(opener, tmp_path: Path) -> None:
    a = opener(**store_kw(tmp_path))
    a.decide(req(1, P1, S1))
    a.close()  # the kept state goes to flash
    c = opener(**store_kw(tmp_path))
    restored = c.decide(req(2, P1, S2))
    assert (restored.reuse, restored.reuse_tier) == ("restored", "disk") and restored.n_reused > 0
    same_as_computed(opener, restored, c)
    grown = c.decide(req(3, P1 + " opened Settings.", S3))  # a state from flash extends as any other
    assert grown.reuse == "restored+stored"


def test_g37c_a_damaged_state_file_is_recomputed_never_used(opener, tmp_path: Path) -> None:
    a = opener(**store_kw(tmp_path))
    a.decide(req(1, P1, S1))
    a.close()
    files = list((tmp_path / "states").rglob("*.state"))
    assert len(files) == 1
    data = files[0].read_bytes()
    files[0].write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    c = opener(**store_kw(tmp_path))
    again = c.decide(req(2, P1, S2))
    assert again.reuse == "stored" and again.reuse_tier == "" and again.n_reused == 0
    assert c.state_counts().corrupt_disk == 1  # type: ignore[union-attr]
    same_as_computed(opener, again)


def test_g37d_a_state_extended_in_the_sequence_is_still_restorable(opener, tmp_path: Path) -> None:
    """An agent's prefix restored and extended leaves two kept states in the sequence, the second
    continuing the first; another agent's prompt then overwrites both: each is copied out first."""
    a = opener(state_ram_mib=64)
    a.decide(req(1, P1, S1))
    a.decide(req(2, P1 + " opened Settings.", S3))  # restored+stored: both states kept
    a.decide(req(3, Q1, S1))  # another agent: the sequence loses both
    restored = a.decide(req(4, P1, S2))
    assert (restored.reuse, restored.reuse_tier) == ("restored", "ram")
    same_as_computed(opener, restored, a)


def test_g37e_the_store_keeps_its_states_across_a_generate(opener, tmp_path: Path) -> None:
    from bmoe.runtime.results import GenerateRequest

    a = opener(state_ram_mib=64)
    a.decide(req(1, P1, S1))
    a.generate(GenerateRequest(prompt="Hello there.", n_predict=4))
    restored = a.decide(req(2, P1, S2))
    assert (restored.reuse, restored.reuse_tier) == ("restored", "ram")
    same_as_computed(opener, restored)


def test_g37f_interleaved_chat_turns_restore_their_own_conversation(opener, tmp_path: Path) -> None:
    """Two conversations taking turns on one session: each second turn restores the state kept at
    the end of its own first turn's message (reported as reused), whatever the other did."""
    from bmoe.runtime.chat import Message
    from bmoe.runtime.results import GenerateRequest

    s = opener(state_ram_mib=64)
    tasks = ["Turn on Wi-Fi, please.", "Call my mother on speaker."]
    histories: list[list[Message]] = [[], []]
    firsts, seconds = [], []
    for turn, prompt in enumerate(["", "Go on with the next step."]):
        for k in range(2):
            s.set_history(histories[k])
            r = s.generate(GenerateRequest(prompt=prompt or tasks[k], n_predict=4, clear_kv=False))
            (firsts if turn == 0 else seconds).append(r)
            histories[k] = list(s.history)
    assert all(r.n_reused > max(f.n_reused for f in firsts) for r in seconds), [r.n_reused for r in seconds]
    assert s.state_counts().hits_ram >= 2  # type: ignore[union-attr]
    from bmoe.wire.records import done_fields

    assert [done_fields(r).get("reuse_tier") for r in firsts + seconds] == [None, None, "ram", "ram"]


def test_g37g_a_batch_restores_each_prefix_from_the_store(opener, tmp_path: Path) -> None:
    """decide_batch: two agents' decisions in one list, twice; the second list restores both."""
    a = opener(state_ram_mib=64)
    a.decide_many([req(1, P1, S1), req(2, Q1, S1)])
    again = a.decide_many([req(3, P1, S2), req(4, Q1, S2)])
    assert [(r.reuse, r.reuse_tier) for r in again] == [("restored", "ram")] * 2
    b = opener()
    b.decide_many([req(1, P1, S1), req(2, Q1, S1)])
    computed = b.decide_many([req(3, P1, S2), req(4, Q1, S2)])
    assert [r.scores.choice_logp for r in again] == [r.scores.choice_logp for r in computed]


def test_g37h_with_the_ram_tier_off_every_family_keeps_its_states_on_flash(opener, tmp_path: Path) -> None:
    """--state-ram-mib 0 with a flash tier: states go straight to flash (attention models' too,
    which live in the sequence until it loses them) and come back exact."""
    a = opener(state_ram_mib=0, state_disk_mib=64, state_dir=tmp_path / "states")
    a.decide(req(1, P1, S1))
    a.decide(req(2, Q1, S1))  # another agent: the first state leaves the sequence, to flash
    restored = a.decide(req(3, P1, S2))
    assert (restored.reuse, restored.reuse_tier) == ("restored", "disk") and restored.n_reused > 0
    same_as_computed(opener, restored, a)
    counts = a.state_counts()
    assert counts is not None and (counts.states_ram, counts.hits_disk, counts.hits_ram) == (0, 1, 0)
