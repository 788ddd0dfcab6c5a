"""Every generation path goes through the state store (issue #37): a fresh generate() (clear_kv
true) and a chat turn with images keep their state and restore it on a later call, whatever ran in
between (docs/decide.md "The state store")."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe.config import SessionConfig
from bmoe.runtime.results import GenerateRequest
from bmoe.session import Session
from bmoe.testing import write_hf_arch, write_hf_mmproj, write_png

LONG = "You control a phone. Task: turn on Wi-Fi. History: opened Settings, scrolled down, found Network."
OTHER = "You route requests. Pick the team for this ticket: my invoice is wrong twice now."


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])
def test_a_fresh_generate_restores_the_state_an_earlier_one_kept(tiny_models, tmp_path: Path, arch: str) -> None:
    cfg = SessionConfig(model=tiny_models(arch, "q8_0"), decide=True, n_ctx=512, state_ram_mib=16)
    with Session(cfg) as s:
        first = s.generate(GenerateRequest(prompt=LONG, n_predict=4))
        s.generate(GenerateRequest(prompt=OTHER, n_predict=4))  # another caller in between
        again = s.generate(GenerateRequest(prompt=LONG, n_predict=4))
        assert first.n_reused == 0
        assert again.n_reused > 0 and again.reuse_tier == "ram", (again.n_reused, again.reuse_tier)
        assert again.text == first.text
        counts = s.state_counts()
        assert counts is not None and counts.hits_ram >= 1


def test_without_the_store_a_fresh_generate_prefills_whole(tiny_models) -> None:
    cfg = SessionConfig(model=tiny_models("qwen3moe", "q8_0"), decide=True, n_ctx=512)
    with Session(cfg) as s:
        s.generate(GenerateRequest(prompt=LONG, n_predict=4))
        assert s.generate(GenerateRequest(prompt=LONG, n_predict=4)).n_reused == 0


@pytest.fixture(scope="module")
def vl(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("store-images")
    return {
        "model": write_hf_arch("qwen3vlmoe", "q8_0", tiny_dir),
        "mmproj": write_hf_mmproj("qwen3vlmoe", tiny_dir),
        "screen": str(write_png(d / "screen.png", 128, 96, seed=1)),  # 12 image tokens
        "other": str(write_png(d / "other.png", 96, 128, seed=2)),
    }


def test_an_image_chat_turn_restores_its_conversation_from_the_store(vl) -> None:
    cfg = SessionConfig(
        model=vl["model"], mmproj=vl["mmproj"], chat="chatml", n_ctx=1024, decide=True, n_threads=1, state_ram_mib=32
    )
    with Session(cfg) as s:
        first = s.generate(GenerateRequest(prompt="What is on this screen?", images=(vl["screen"],), n_predict=4))
        mine = list(s.history)
        s.generate(GenerateRequest(prompt="And on this one?", images=(vl["other"],), n_predict=4))  # another agent
        s.set_history(mine)
        second = s.generate(GenerateRequest(prompt="Tap the first button.", n_predict=4, clear_kv=False))
        assert second.reuse_tier == "ram", second.reuse_tier
        assert second.n_reused > first.n_prompt // 2, (second.n_reused, first.n_prompt)
