"""The session's store of kept prefix states, built from its settings (docs/decide.md "The state
store"): the model identity that keys its files, the RAM tier's budget and the flash tier's folder.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bmoe.config import SessionConfig
from bmoe.llama.lib import library_version
from bmoe.state_store import DiskTier, ModelIdentity, StateStore

MIB = 1024 * 1024
# The RAM tier when only the flash tier is asked for: states reach flash as they leave RAM.
DEFAULT_RAM_MIB = 256


def default_state_dir() -> Path:
    """$BMOE_CACHE_DIR/states, else ~/.cache/bmoe/states."""
    env = os.environ.get("BMOE_CACHE_DIR")
    return (Path(env) if env else Path.home() / ".cache" / "bmoe") / "states"


def _file_id(path: Path | None) -> str:
    if path is None:
        return ""
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def model_identity(config: SessionConfig) -> ModelIdentity:
    """What a kept state is valid for: the model (and projector) files as they are now, the
    settings that shape a state's bytes (context size, side sequences, attention kernel, experts
    used) and the llama.cpp build."""
    settings = {
        "n_ctx": config.n_ctx,
        "n_seq_max": config.n_seq_max,
        "flash_attn": config.flash_attn,
        "n_expert_used": config.n_expert_used,
        "mmproj": _file_id(config.mmproj),
    }
    return ModelIdentity.of(_file_id(config.model), settings, library_version())


def line(why: str) -> str:
    """The one line a session prints when the flash tier is off, at start or later."""
    return f"bmoe: state store: {why}; prefix states are kept in RAM only"


def open_state_store(config: SessionConfig) -> tuple[StateStore, str]:
    """The store the settings ask for, and the line to print at start ("" when none): an
    unwritable flash folder leaves the store in RAM only."""
    if config.state_ram_mib is None and not config.state_disk_mib:
        return StateStore.last_prefix(), ""
    disk = None
    note = ""
    if config.state_disk_mib:
        ident = model_identity(config).digest()
        folder = (config.state_dir or default_state_dir()) / ident.hex()[:16]
        disk = DiskTier(folder, ident, config.state_disk_mib * MIB, warn=lambda why: print(line(why), file=sys.stderr))
        if not disk.on:
            note = line(disk.disabled)
    ram = (DEFAULT_RAM_MIB if config.state_ram_mib is None else config.state_ram_mib) * MIB
    return StateStore(ram_budget=ram, disk=disk), note
