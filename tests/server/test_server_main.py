"""bmoe-server takes every bmoe-cli session flag, and refuses the CLI's own modes."""
from __future__ import annotations

import pytest

from bmoe.cli import build_parser
from bmoe.server.main import build_server_parser, main


def _options(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def test_every_cli_flag_is_a_server_flag() -> None:
    assert _options(build_parser()) <= _options(build_server_parser())


def test_server_defaults() -> None:
    args = build_server_parser().parse_args([])
    assert (args.host, args.port, args.max_queue, args.no_decide) == ("127.0.0.1", 8080, 8, False)


@pytest.mark.parametrize("argv", [["-p", "hi"], ["--session"], ["--progress"], ["--max-queue", "-1"],
                                  ["--max-body-kb", "0"]])
def test_refused_flags(argv, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "bmoe-server" in capsys.readouterr().err
