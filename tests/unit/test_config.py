"""Every SessionConfig refusal, by its message."""
from pathlib import Path

import pytest

from bmoe.config import SessionConfig
from bmoe.errors import ConfigError


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF")
    return p


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("n_ctx", 8, "n_ctx: must be an integer >= 16, got 8"),
        ("n_ctx", True, "n_ctx: must be an integer >= 16, got True"),
        ("n_batch", 0, "n_batch: must be an integer >= 1, got 0"),
        ("n_ubatch", 1024, "n_ubatch: must be <= n_batch (512), got 1024"),
        ("n_threads", -1, "n_threads: must be an integer >= 0, got -1"),
        ("n_predict", 0, "n_predict: must be an integer >= 1, got 0"),
        ("temperature", -0.5, "temperature: must be a number in [0, 10], got -0.5"),
        ("top_p", 0.0, "top_p: must be a number in (0, 1], got 0.0"),
        ("seed", -3, "seed: must be a non-negative integer, got -3"),
        ("chat", "jinja", "chat: must be one of template, chatml, none, got 'jinja'"),
        ("think", "yes", "think: must be true or false, got 'yes'"),
        ("moe_stream", 1, "moe_stream: must be true or false, got 1"),
        ("flash_attn", "on", "flash_attn: must be true, false or unset, got 'on'"),
        ("cache_mb", -5, "cache_mb: must be an integer >= 0, got -5"),
        ("cache_mb", "lots", "cache_mb: must be an integer >= 0, got 'lots'"),
        ("io_threads", 0, "io_threads: must be an integer >= 1, got 0"),
        ("decide_prefix_cache", "maybe", "decide_prefix_cache: must be one of auto, on, off, got 'maybe'"),
    ],
)
def test_each_bad_field_is_named(model: Path, field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        SessionConfig(model=model, **{field: value})
    assert str(e.value) == message


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^model: file not found: .*nope\.gguf$"):
        SessionConfig(model=tmp_path / "nope.gguf")


def test_defaults_are_valid(model: Path) -> None:
    cfg = SessionConfig(model=model, cache_mb="auto")
    assert cfg.cache_mb == "auto" and cfg.threads >= 1
