"""The sandbox chat templates render in: Jinja's immutable sandbox, with what Hugging Face's chat
templates expect of it (``tojson``, ``raise_exception``, ``strftime_now``, loop controls, and the
``{% generation %}`` tag).

``{% generation %}`` ... ``{% endgeneration %}`` marks the assistant's tokens for a training
loss mask (LFM2.5, poolside Laguna); for inference its body renders as it is, in a scope of its
own as transformers renders it.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Callable

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise(msg: str) -> None:
    raise TemplateError(msg)


def _tojson(value: object, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


class GenerationTag(Extension):
    """``{% generation %}`` BODY ``{% endgeneration %}``: BODY, unchanged."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Callable[[], str]) -> str:
        return caller()


def environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", GenerationTag]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env
