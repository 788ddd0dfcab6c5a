"""The state store's settings: refusals, and what a session prints when its folder is unwritable."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe.config import SessionConfig, validate
from bmoe.errors import ConfigError


def test_a_state_dir_without_a_flash_tier_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(
        ConfigError, match=r"^state_dir: only means something with state_disk_mib above 0 \(the flash tier\)$"
    ):
        validate(SessionConfig(model=model, state_dir=tmp_path))


@pytest.mark.parametrize("field", ["state_ram_mib", "state_disk_mib"])
def test_the_store_without_decide_is_refused(tmp_path: Path, field: str) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(
        ConfigError, match=rf"^{field}: the state store lives with decide \(docs/decide.md\); give --decide too$"
    ):
        validate(SessionConfig(model=model, **{field: 8}))


@pytest.mark.parametrize("field", ["state_ram_mib", "state_disk_mib"])
def test_a_negative_budget_is_refused(tmp_path: Path, field: str) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match=rf"^{field}: must be an integer >= 0, got -1$"):
        validate(SessionConfig(model=model, **{field: -1}))


def test_an_unwritable_store_folder_prints_one_line_and_keeps_states_in_ram(tiny_models, tmp_path, capfd) -> None:
    from bmoe.decide.types import DecideRequest
    from bmoe.session import Session

    (tmp_path / "file").write_text("")
    folder = tmp_path / "file" / "states"
    with Session(
        SessionConfig(
            model=tiny_models("qwen3moe", "q8_0"), decide=True, n_ctx=512, state_disk_mib=16, state_dir=folder
        )
    ) as s:
        lines = [ln for ln in capfd.readouterr().err.splitlines() if "state store" in ln]
        assert len(lines) == 1 and lines[0].startswith(f"bmoe: state store: the store folder {folder / ''}")
        assert lines[0].endswith("; prefix states are kept in RAM only")
        ask = DecideRequest(id=1, prefix="Task: wifi. History:", suffix=" none. A or B?", choices=("A", "B"))
        s.decide(ask)
        assert s.decide(ask).reuse_tier == "ram"
