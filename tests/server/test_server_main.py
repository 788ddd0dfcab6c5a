"""bmoe-server takes every session flag (the one table bmoe-cli takes them from), and refuses the
CLI's own modes."""

from __future__ import annotations

import pytest

from bmoe.cli import build_parser
from bmoe.flags import SESSION_FLAGS
from bmoe.server.main import build_server_parser, main


def _options(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def test_every_session_flag_is_a_cli_and_a_server_flag() -> None:
    session_flags = {n for f in SESSION_FLAGS for n in f.names}
    assert session_flags <= _options(build_parser())
    assert session_flags <= _options(build_server_parser())


def test_the_server_decides_by_default_and_refuses_both_decide_flags_at_once(capsys) -> None:
    p = build_server_parser()
    assert not p.parse_args([]).no_decide and p.parse_args(["--no-decide"]).no_decide
    with pytest.raises(SystemExit):
        p.parse_args(["--decide", "--no-decide"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_server_defaults() -> None:
    args = build_server_parser().parse_args([])
    assert (args.host, args.port, args.max_queue, args.no_decide) == ("127.0.0.1", 8080, 8, False)


@pytest.mark.parametrize(
    "argv", [["-p", "hi"], ["--session"], ["--progress"], ["--json"], ["--max-queue", "-1"], ["--max-body-kb", "0"]]
)
def test_refused_flags(argv, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "bmoe-server" in capsys.readouterr().err


def test_a_model_that_is_a_folder(tmp_path, capsys) -> None:
    assert main(["-m", str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"bmoe-server: model: {tmp_path} is a folder, not a .gguf file\n"
