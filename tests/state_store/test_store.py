"""The state store's policy, with byte payloads standing in for a backend's saved states."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bmoe.decide.kept_prefix import TIER_DISK, TIER_RAM
from bmoe.decide.port import KeptState
from bmoe.state_store import DiskTier, ModelIdentity, StateStore
from bmoe.state_store.trie import TokenTrie

IDENT = ModelIdentity.of("m.gguf:100:1", {"n_ctx": 512, "type_k": "f16"}, "0.3.36").digest()


def state(tokens: list[int], size: int = 100, fill: int | None = None) -> KeptState:
    v = (fill if fill is not None else len(tokens)) % 256
    return KeptState(data=np.full(size, v, dtype=np.uint8), n_tokens=len(tokens))


class Handle:
    """A backend's handle to a state living in its sequence: 0 bytes until copied out."""

    def __init__(self) -> None:
        self.copy: np.ndarray | None = None

    def __len__(self) -> int:
        return 0 if self.copy is None else self.copy.nbytes


def disk(tmp_path: Path, budget: int = 10_000, ident: bytes = IDENT) -> DiskTier:
    return DiskTier(tmp_path / "states", ident, budget)


# --- the trie -------------------------------------------------------------------------------


def test_trie_finds_the_longest_kept_prefix_and_where_the_prompt_parts() -> None:
    t: TokenTrie[str] = TokenTrie()
    t.put((1, 2), "a")
    t.put((1, 2, 3, 4), "b")
    t.put((1, 5), "c")
    assert t.longest((1, 2, 3, 4, 9)) == (4, "b", 4)
    assert t.longest((1, 2, 3, 7)) == (2, "a", 3)
    assert t.longest((9,)) == (0, None, 0)
    t.remove((1, 2, 3, 4))
    assert t.longest((1, 2, 3, 4)) == (2, "a", 2) and len(t) == 2
    assert sorted(k for k, _ in t.items()) == [(1, 2), (1, 5)]


# --- RAM tier -------------------------------------------------------------------------------


def test_the_longest_kept_prefix_is_restored_among_many() -> None:
    s = StateStore(ram_budget=10_000)
    for toks in ([1, 2], [1, 2, 3, 4], [7, 8, 9]):
        s.store(toks, state(toks))
    hit = s.lookup([1, 2, 3, 4, 5])
    assert hit.kept is not None and hit.kept.tokens == (1, 2, 3, 4) and hit.tier == TIER_RAM
    assert s.lookup([7, 8, 9]).kept.tokens == (7, 8, 9)  # type: ignore[union-attr]
    miss = s.lookup([7, 8, 1])
    assert miss.kept is None and miss.differs_at == 2
    c = s.counts()
    assert (c.hits_ram, c.misses, c.states_ram, c.bytes_ram) == (2, 1, 3, 300)


def test_nothing_kept_is_a_miss_without_a_difference() -> None:
    s = StateStore(ram_budget=1000)
    assert s.lookup([1, 2]).differs_at is None and s.counts().misses == 1


def test_ram_evicts_the_least_recently_used_within_its_budget() -> None:
    s = StateStore(ram_budget=250)
    s.store([1], state([1]))
    s.store([2], state([2]))
    s.lookup([1, 9])  # [1] used last: [2] goes first
    s.store([3], state([3]))
    assert [k.tokens for k in s.held] == [(1,), (3,)]
    assert s.counts().evictions_ram == 1 and s.counts().bytes_ram == 200


def test_a_state_that_grows_when_copied_out_is_fitted_on_the_next_call() -> None:
    s = StateStore(ram_budget=150)
    h = Handle()
    s.store([1], KeptState(data=h, n_tokens=1))
    s.store([2], state([2]))
    assert s.counts().bytes_ram == 100
    h.copy = np.zeros(100, dtype=np.uint8)  # the backend copied it out of its sequence
    s.lookup([2])
    assert [k.tokens for k in s.held] == [(2,)] and s.counts().evictions_ram == 1


def test_last_prefix_keeps_one_state_and_make_room_drops_it_before_a_replacement() -> None:
    s = StateStore.last_prefix()
    s.store([1, 2], state([1, 2]))
    s.store([1, 2, 3], state([1, 2, 3]))
    assert [k.tokens for k in s.held] == [(1, 2, 3)]
    assert s.lookup([1, 2]).differs_at == 2  # shorter than the kept one: a miss
    s.make_room([5])
    assert s.held == () and s.kept is None


def test_a_state_of_another_length_is_refused() -> None:
    with pytest.raises(ValueError, match="a saved state of 3 tokens cannot be kept for a 2-token prefix"):
        StateStore.last_prefix().store([1, 2], KeptState(data=b"x", n_tokens=3))


def test_a_ram_budget_of_zero_keeps_nothing_in_ram() -> None:
    s = StateStore(ram_budget=0)
    s.store([1], state([1]))
    assert s.held == () and s.lookup([1]).kept is None


# --- flash tier -----------------------------------------------------------------------------


def test_states_leaving_ram_go_to_flash_and_come_back_exact(tmp_path: Path) -> None:
    s = StateStore(ram_budget=100, disk=disk(tmp_path))
    s.store([1, 2], state([1, 2], fill=7))
    s.store([3], state([3]))  # [1, 2] spills
    hit = s.lookup([1, 2, 5])
    assert hit.tier == TIER_DISK and hit.kept is not None and hit.kept.tokens == (1, 2)
    assert bytes(np.asarray(hit.kept.state.data)) == bytes([7] * 100)
    c = s.counts()
    assert (c.hits_disk, c.states_disk, c.evictions_ram) == (1, 2, 2)  # [3] spilled when [1, 2] came back
    assert c.bytes_disk == sum(p.stat().st_size for p in (tmp_path / "states").glob("*.state"))


def test_flash_states_survive_a_restart_of_the_same_model_only(tmp_path: Path) -> None:
    s = StateStore(ram_budget=1000, disk=disk(tmp_path))
    s.store([1, 2], state([1, 2]))
    s.flush()
    again = StateStore(ram_budget=1000, disk=disk(tmp_path))
    assert again.lookup([1, 2, 3]).tier == TIER_DISK
    other = ModelIdentity.of("m.gguf:100:1", {"n_ctx": 1024, "type_k": "f16"}, "0.3.36").digest()
    assert StateStore(ram_budget=1000, disk=disk(tmp_path, ident=other)).lookup([1, 2, 3]).kept is None


def test_flash_evicts_least_recently_used_files_within_its_budget(tmp_path: Path) -> None:
    d = disk(tmp_path, budget=400)  # one file: 88-byte header, tokens, 100-byte payload
    s = StateStore(ram_budget=0, disk=d)
    for i in range(4):
        s.store([i], state([i]))
        os.utime(tmp_path / "states" / d.index.get([i]).name, ns=(i * 10**9, i * 10**9))  # type: ignore[union-attr]
        d.index.get([i]).used = i * 10**9  # type: ignore[union-attr]
    c = s.counts()
    assert c.states_disk == 2 and c.evictions_disk == 2 and c.bytes_disk <= 400
    assert s.lookup([0]).kept is None and s.lookup([3]).tier == TIER_DISK


@pytest.mark.parametrize("damage", ["flip", "truncate", "replace", "empty"])
def test_a_damaged_file_is_detected_deleted_and_never_used(tmp_path: Path, damage: str) -> None:
    d = disk(tmp_path)
    s = StateStore(ram_budget=0, disk=d)
    s.store([1, 2], state([1, 2]))
    s.store([5, 6], state([5, 6], fill=9))
    path = tmp_path / "states" / d.index.get([1, 2]).name  # type: ignore[union-attr]
    other = tmp_path / "states" / d.index.get([5, 6]).name  # type: ignore[union-attr]
    data = path.read_bytes()
    if damage == "flip":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "truncate":
        path.write_bytes(data[:-10])
    elif damage == "replace":
        path.write_bytes(other.read_bytes())  # a whole, valid file of other tokens
    else:
        path.write_bytes(b"")
    assert s.lookup([1, 2, 3]).kept is None
    if damage in ("flip", "truncate"):  # indexed by its header, then failed the checks on reading
        assert not path.exists() and s.counts().corrupt_disk == 1
    # A file whose header no longer names these tokens is not indexed for them at all.
    assert s.lookup([5, 6]).tier == TIER_DISK  # the others are untouched


def test_an_unwritable_folder_turns_the_flash_tier_off_with_a_reason(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    d = DiskTier(tmp_path / "file" / "states", IDENT, 1000)
    assert not d.on and d.disabled.startswith(f"the store folder {tmp_path / 'file' / 'states'} is not writable (")
    s = StateStore(ram_budget=1000, disk=d)
    s.store([1], state([1]))
    assert s.lookup([1]).tier == TIER_RAM


def test_a_failed_write_turns_the_flash_tier_off_and_ram_goes_on(tmp_path: Path) -> None:
    d = disk(tmp_path)
    s = StateStore(ram_budget=100, disk=d)
    (tmp_path / "states").rename(tmp_path / "gone")  # a write now fails, as on a full disk
    s.store([1], state([1]))
    s.store([2], state([2]))  # [1] spills: the write fails
    assert d.disabled.startswith(f"writing a state to {tmp_path / 'states'} failed (")
    assert s.lookup([2]).tier == TIER_RAM and s.counts().states_ram == 1


def test_an_in_sequence_state_leaving_ram_is_held_until_copied_then_written(tmp_path: Path) -> None:
    s = StateStore(ram_budget=100, disk=disk(tmp_path), max_states=1)
    handle = Handle()
    s.store([1], KeptState(data=handle, n_tokens=1))
    s.store([2], state([2]))  # [1] leaves RAM with no bytes yet: held, so the backend copies it out
    assert [k.tokens for k in s.held] == [(2,), (1,)] and s.counts().states_disk == 0
    handle.copy = np.full(100, 7, dtype=np.uint8)  # the sequence lost it: the backend's copy
    found = s.lookup([1, 5])
    assert found.tier == TIER_DISK and bytes(found.kept.state.data) == bytes([7]) * 100  # type: ignore[union-attr]


@pytest.mark.parametrize("ram_budget", [0, 100])
def test_an_in_sequence_state_never_copied_is_dropped_by_drop(tmp_path: Path, ram_budget: int) -> None:
    s = StateStore(ram_budget=ram_budget, disk=disk(tmp_path), max_states=1 if ram_budget else None)
    s.store([1], KeptState(data=Handle(), n_tokens=1))
    s.drop()
    assert s.held == () and s.counts().states_disk == 0 and s.lookup([1]).kept is None


def test_a_ram_budget_of_zero_with_flash_sends_every_state_to_flash(tmp_path: Path) -> None:
    s = StateStore(ram_budget=0, disk=disk(tmp_path))
    handle = Handle()
    s.store([1], KeptState(data=handle, n_tokens=1))  # an attention model's state: in the sequence
    s.store([2], state([2]))
    assert [k.tokens for k in s.held] == [(1,)]
    handle.copy = np.full(100, 9, dtype=np.uint8)
    s.flush()
    assert s.counts().states_disk == 2 and s.counts().states_ram == 0 and s.held == ()
    assert s.lookup([1]).tier == TIER_DISK and s.lookup([2]).tier == TIER_DISK


def test_a_disk_budget_smaller_than_a_state_writes_nothing(tmp_path: Path) -> None:
    s = StateStore(ram_budget=0, disk=disk(tmp_path, budget=50))
    s.store([1], state([1]))
    assert s.counts().states_disk == 0


_WRITER = """
import sys, numpy as np
from pathlib import Path
from bmoe.state_store import DiskTier
d = DiskTier(Path(sys.argv[1]), bytes.fromhex(sys.argv[2]), 10**9)
for i in range(40):
    d.put([i, i + 1], np.full(20000, i % 256, dtype=np.uint8))
"""


def test_two_processes_sharing_a_folder_never_read_a_half_written_file(tmp_path: Path) -> None:
    folder = tmp_path / "states"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(folder), IDENT.hex()], env=env)
    folder.mkdir(parents=True, exist_ok=True)
    reader = DiskTier(folder, IDENT, 10**9)
    done = False
    while not done:
        done = writer.poll() is not None  # then one last scan, after the writer's last rename
        reader._seen_mtime = -1  # scan every time, mid-write included
        reader.rescan()
        for i in range(40):
            data = reader.get([i, i + 1])
            if data is not None:
                assert data.nbytes == 20000 and int(data[0]) == i % 256
    seen = len(reader.index)
    assert writer.wait() == 0 and reader.corrupt == 0 and seen == 40
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_failed_write_is_told_once(tmp_path: Path) -> None:
    told: list[str] = []
    d = DiskTier(tmp_path / "states", IDENT, 10_000, warn=told.append)
    (tmp_path / "states").rename(tmp_path / "gone")
    assert not d.put([1], b"x" * 10) and not d.put([2], b"x" * 10)
    assert told == [d.disabled]


def test_the_folder_is_scanned_again_only_when_another_process_changed_it(tmp_path: Path, monkeypatch) -> None:
    d = disk(tmp_path)
    reads: list[Path] = []
    real = DiskTier._read_head
    monkeypatch.setattr(DiskTier, "_read_head", lambda self, p: reads.append(p) or real(self, p))
    d.put([1], b"x" * 10)
    d.put([2], b"x" * 10)
    d.rescan()
    assert reads == []  # its own writes are in the index already
    other = disk(tmp_path)  # another process sharing the folder
    os.utime(tmp_path / "states", ns=(1, 1))  # its write, as the folder's time shows it
    other.put([3], b"x" * 10)
    d.rescan()
    assert len(reads) >= 3 and d.index.get([3]) is not None
