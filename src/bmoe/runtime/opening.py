"""What opening a session refuses before it loads anything, in one place: the open runs it, and so
does ``--plan-only`` (``bmoe.session.check_opening``), which therefore refuses exactly what opening
refuses, with the same line (docs/plan.md)."""

from __future__ import annotations

from pathlib import Path

from bmoe.config import SessionConfig
from bmoe.errors import ConfigError, ModelFileError
from bmoe.llama.model import ModelLoadError, refuse_early
from bmoe.runtime.expert_streaming import check_streaming
from bmoe.stream import LayoutError, NothingToStreamError, UnsupportedArchError, read_layout
from bmoe.stream.layout import read_header, shard_paths


def check_model_file(model: Path) -> None:
    """A missing, empty or non-GGUF file, a folder, and a GGUF whose header cannot be read or whose
    tensors run past its end (truncated or damaged): a ModelLoadError naming the user's file."""
    refuse_early(Path(model), Path(model))
    try:
        read_layout(model)  # reads every shard's header and checks each tensor lies inside its file
    except LayoutError as e:
        raise ModelLoadError(f"model: {e}") from None
    except (NothingToStreamError, UnsupportedArchError):
        pass  # sound, with nothing bmoe streams: --moe-stream's check says so where it is asked for


def check_opening(config: SessionConfig, *, streaming: bool = True) -> tuple[tuple[str, int], ...]:
    """Refuse what opening ``config`` would refuse before loading the weights: the model file, the
    expert count (``n_expert_used``), and with ``moe_stream`` (unless ``streaming`` is False:
    ``open_streaming`` runs that part itself) the streaming settings against the file. Returns the
    metadata override ``expert_used_override`` gives."""
    check_model_file(Path(config.model))
    overrides = expert_used_override(config)
    if streaming and config.moe_stream:
        check_streaming(config)
    return overrides


def expert_used_override(config: SessionConfig) -> tuple[tuple[str, int], ...]:
    """The metadata override ``n_expert_used`` asks llama.cpp to load with,
    ``((<arch>.expert_used_count, K),)``, or ``()`` for the model's own number.

    What K the model allows is known only from its file, so it is checked here against the GGUF
    header, before anything is opened or written: a ConfigError naming the field. (Loaded with a K
    above the expert count, llama.cpp stops the whole process on an assertion; on a model without
    experts it ignores the key.)"""
    k = config.n_expert_used
    if k is None:
        return ()
    try:
        fields = read_header(shard_paths(Path(config.model))[0]).fields
    except (OSError, ValueError) as e:
        raise ModelFileError(f"model: cannot read GGUF {config.model}: {e}") from None
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(f"model: {config.model} has no general.architecture")
    count = fields.get(f"{arch}.expert_count")
    n_expert = count if isinstance(count, int) and not isinstance(count, bool) else 0
    if n_expert <= 0:
        raise ConfigError(
            f"n_expert_used: the model has no experts ({arch}.expert_count is "
            f"{count if isinstance(count, int) else 'not set'}): it is a dense model, with no "
            "experts per token to change"
        )
    if k > n_expert:
        raise ConfigError(f"n_expert_used: {k} is more than the model's {n_expert} experts ({arch}.expert_count)")
    return ((f"{arch}.expert_used_count", k),)
