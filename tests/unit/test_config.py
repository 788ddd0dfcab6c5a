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
        ("n_ubatch", 0, "n_ubatch: must be an integer >= 1, got 0"),
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
        ("io_threads", 65, "io_threads: at most 64 (each read lane is a thread), got 65"),
        # streaming settings without moe_stream would be ignored: the user meant to stream
        (
            "cache_mb",
            4096,
            "cache_mb: only means something with moe_stream (a resident model maps the whole file, "
            "experts included, and the kernel keeps what fits)",
        ),
        (
            "cache_mb",
            "auto",
            "cache_mb: only means something with moe_stream (a resident model maps the whole "
            "file, experts included, and the kernel keeps what fits)",
        ),
        (
            "cache_force",
            True,
            "cache_force: only means something with moe_stream (a resident model maps the "
            "whole file, experts included, and the kernel keeps what fits)",
        ),
        (
            "odirect",
            False,
            "odirect: only means something with moe_stream (a resident model maps the whole file, "
            "experts included, and the kernel keeps what fits)",
        ),
        (
            "stream_read_all",
            True,
            "stream_read_all: only means something with moe_stream (a resident model maps "
            "the whole file, experts included, and the kernel keeps what fits)",
        ),
        ("decide_prefix_cache", "maybe", "decide_prefix_cache: must be one of auto, on, off, got 'maybe'"),
        ("prefetch_wide_tokens", -1, "prefetch_wide_tokens: must be an integer >= 0, got -1"),
        ("prefetch_wide_tokens", 8, "prefetch_wide_tokens: only means something with prefetch on"),
        # what the model allows (its expert count) is checked at open: tests/engine/test_n_expert_used.py
        ("n_expert_used", 0, "n_expert_used: must be an integer >= 1, got 0"),
        ("n_expert_used", -1, "n_expert_used: must be an integer >= 1, got -1"),
        ("n_expert_used", True, "n_expert_used: must be an integer >= 1, got True"),
        ("n_expert_used", "4", "n_expert_used: must be an integer >= 1, got '4'"),
        ("n_expert_used", 2.0, "n_expert_used: must be an integer >= 1, got 2.0"),
    ],
)
def test_each_bad_field_is_named(model: Path, field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        SessionConfig(model=model, **{field: value})
    assert str(e.value) == message


def test_a_one_token_wide_cut_is_refused(model: Path) -> None:
    with pytest.raises(ConfigError, match=r"^prefetch_wide_tokens: must be 0 \(the default rule\) or at least 2"):
        SessionConfig(model=model, moe_stream=True, prefetch=True, prefetch_wide_tokens=1)
    assert SessionConfig(model=model, moe_stream=True, prefetch=True, prefetch_wide_tokens=2).prefetch_wide_tokens == 2


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^model: file not found: .*nope\.gguf$"):
        SessionConfig(model=tmp_path / "nope.gguf")


def test_defaults_are_valid(model: Path) -> None:
    cfg = SessionConfig(model=model, moe_stream=True, cache_mb="auto")
    assert cfg.cache_mb == "auto" and cfg.threads >= 1


# --- the one flag table ---------------------------------------------------------------------
def test_every_session_flag_reaches_its_field(model: Path) -> None:
    from bmoe.cli import build_parser
    from bmoe.flags import config_from_flags

    args = build_parser().parse_args(
        [
            "-n",
            "7",
            "-c",
            "64",
            "-b",
            "32",
            "-ub",
            "16",
            "-t",
            "1",
            "--temp",
            "0.5",
            "--top-p",
            "0.9",
            "--seed",
            "3",
            "--chatml",
            "--no-think",
            "--flash-attn",
            "off",
            "--kv-f32",
            "--moe-stream",
            "--cache-mb",
            "auto",
            "--cache-ceil-mb",
            "9",
            "--cache-force",
            "--no-odirect",
            "--io-threads",
            "2",
            "--twin-dir",
            "/tmp/x",
            "--stream-read-all",
            "--decide",
            "--decide-prefix-cache",
            "on",
            "--prefill-min-tokens",
            "5",
            "--n-expert-used",
            "3",
        ]
    )
    cfg = config_from_flags(args, model)
    assert (cfg.n_predict, cfg.n_ctx, cfg.n_batch, cfg.n_ubatch, cfg.n_threads) == (7, 64, 32, 16, 1)
    assert (cfg.temperature, cfg.top_p, cfg.seed, cfg.chat, cfg.think, cfg.flash_attn, cfg.kv_f32) == (
        0.5,
        0.9,
        3,
        "chatml",
        False,
        False,
        True,
    )
    assert (cfg.moe_stream, cfg.cache_mb, cfg.cache_ceil_mb, cfg.cache_force, cfg.odirect, cfg.io_threads) == (
        True,
        "auto",
        9,
        True,
        False,
        2,
    )
    assert (cfg.twin_dir, cfg.stream_read_all, cfg.decide, cfg.decide_prefix_cache) == (
        Path("/tmp/x"),
        True,
        True,
        "on",
    )
    assert (cfg.prefill_device, cfg.prefill_min_tokens, cfg.prefetch, cfg.n_expert_used) == (None, 5, False, 3)
    # and the defaults are SessionConfig's own
    assert config_from_flags(build_parser().parse_args([]), model) == SessionConfig(model=model)


def test_a_config_message_names_the_flag_at_a_command_line() -> None:
    from bmoe.flags import flag_message

    assert (
        flag_message("n_ctx: must be an integer >= 16, got 8") == "--ctx-size (n_ctx): must be an integer >= 16, got 8"
    )
    assert flag_message("cache_mb: 3 is below the floor") == "--cache-mb (cache_mb): 3 is below the floor"
    assert flag_message("model: file not found: x.gguf") == "model: file not found: x.gguf"
    assert flag_message("something else entirely") == "something else entirely"


def test_the_cli_refuses_a_bad_setting_with_one_line(model: Path, capsys) -> None:
    from bmoe.cli import main

    assert main(["-m", str(model), "-c", "8", "-p", "hi"]) == 1
    err = capsys.readouterr().err
    assert err == "bmoe-cli: --ctx-size (n_ctx): must be an integer >= 16, got 8\n"
    assert main(["-m", str(model), "-c", "8", "--session"]) == 1
    out, err = capsys.readouterr()
    assert out == 'BMOE_ERROR {"id":null,"fatal":true,"msg":"--ctx-size (n_ctx): must be an integer >= 16, got 8"}\n'


def test_json_is_refused_with_session(capsys) -> None:
    """--json shapes the one-shot answer's stdout; the line protocol has its own (exit 2, usage error)."""
    from bmoe.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--session", "--json"])
    assert e.value.code == 2
    assert "bmoe-cli: error: argument --json: not allowed with argument --session" in capsys.readouterr().err


def test_a_folder_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"model: {tmp_path} is a folder, not a .gguf file"):
        SessionConfig(model=tmp_path)


def test_a_path_the_os_refuses_is_a_config_error(capsys) -> None:
    from bmoe.cli.main import main

    too_long = "a" * 300 + ".gguf"  # over NAME_MAX: the OS refuses to look at it
    with pytest.raises(ConfigError, match=r"^model: cannot use a+\.gguf: File name too long$"):
        SessionConfig(model=too_long)
    assert main(["-m", too_long, "-p", "hi"]) == 1
    assert capsys.readouterr().err.startswith("bmoe-cli: model: cannot use a")  # one line, not "internal error"


def test_a_cache_ceiling_needs_the_auto_budget(model: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^cache_ceil_mb: only means something with cache_mb auto, got cache_mb 512$"
    ):
        SessionConfig(model=model, moe_stream=True, cache_mb=512, cache_ceil_mb=1024)
    assert SessionConfig(model=model, moe_stream=True, cache_mb="auto", cache_ceil_mb=1024).cache_ceil_mb == 1024


@pytest.mark.parametrize("extra, named", [(["-p", "hi"], "-p/--prompt"), (["--progress"], "--progress")])
def test_one_shot_flags_are_refused_with_session(capsys, extra: list[str], named: str) -> None:
    """A session reads its prompts from stdin: a -p or --progress beside --session would be ignored."""
    from bmoe.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--session", *extra])
    assert e.value.code == 2
    assert f"bmoe-cli: error: argument --session: not allowed with argument {named}" in capsys.readouterr().err
