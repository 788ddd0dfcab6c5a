"""Arguments as Python keyword arguments (``args="python"``, LFM2): ``name(city='Paris', days=3)``,
each value a Python literal: strings as ``repr`` quotes them, ``True``/``False``/``None``,
lists ``[...]`` and dicts ``{'k': v}``.

Writing (``repr`` of each value), reading back and the grammar of a value from its schema. Reading
takes each value's text apart with ``ast`` and turns only literals into values (never ``eval``);
it also takes JSON's ``true``/``false``/``null``, as LFM2.5's template writes a dict argument
with ``tojson``. The grammar follows the schema as Gemma 4's does (tool_keyed), keys in the
schema's order; a string may be quoted either way, with backslash escapes.
"""

from __future__ import annotations

import ast
import json
import re

from bmoe.constrain.tool_keyed import KeyedGrammar, Short


def write_kwargs(args: dict) -> str:
    """A call's arguments, as between its parentheses."""
    return ", ".join(f"{k}={v!r}" for k, v in args.items())


_KW = re.compile(r"\s*([^\s=,()'\"\[\]{}]+)\s*=(?!=)")
_CLOSE = {")": "(", "]": "[", "}": "{"}
_WORDS = {"true": True, "false": False, "null": None}


def read_kwargs(text: str, at: int) -> tuple[dict, int]:
    """The keyword arguments from ``at`` up to the call's ``)`` (not read); where they end."""
    out: dict = {}
    while True:
        at = _skip(text, at)
        if text[at] == ")":
            return out, at
        if out:
            if text[at] != ",":
                raise ValueError(f"expected ',' or ')' at {text[at : at + 20]!r}")
            at = _skip(text, at + 1)
            if text[at] == ")":  # a trailing comma
                return out, at
        kw = _KW.match(text, at)
        if kw is None:
            if re.fullmatch(r"[A-Za-z0-9_.-]*\s*", text[at:]):
                raise Short()
            raise ValueError(f"expected a keyword argument (key=value) at {text[at : at + 20]!r}")
        at = _value_end(text, kw.end())
        out[kw.group(1)] = literal(text[kw.end() : at], kw.group(1))


def _skip(text: str, at: int) -> int:
    """Past the whitespace at ``at``; Short where the text ends there."""
    at = len(text) - len(text[at:].lstrip())
    if at >= len(text):
        raise Short()
    return at


def _value_end(text: str, at: int) -> int:
    """Where the value from ``at`` ends: the ``,`` or ``)`` after it, outside brackets and strings."""
    stack: list[str] = []
    quote = ""
    i = at
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            stack.append(c)
        elif c in ")]}":
            if not stack:
                if c == ")":
                    return i
                raise ValueError(f"unbalanced {c!r} at {text[i : i + 20]!r}")
            if stack.pop() != _CLOSE[c]:
                raise ValueError(f"unbalanced {c!r} at {text[i : i + 20]!r}")
        elif c == "," and not stack:
            return i
        i += 1
    raise Short()


def literal(source: str, key: str) -> object:
    """A value's text as its value: Python literals only (and JSON's three words)."""
    try:
        node = ast.parse(source.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        raise ValueError(f"its argument {key!r} is not a Python literal: {source.strip()[:40]!r}") from None
    return _value(node, key)


def _value(node: ast.AST, key: str) -> object:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _value(node.operand, key)
        if isinstance(inner, (int, float)) and not isinstance(inner, bool):
            return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.Name) and node.id in _WORDS:
        return _WORDS[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e, key) for e in node.elts]
    if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        keys = [_value(k, key) for k in node.keys if k is not None]
        if all(isinstance(k, str) for k in keys):
            return dict(zip(keys, (_value(v, key) for v in node.values)))
    raise ValueError(f"its argument {key!r} holds {ast.unparse(node)[:40]!r}, which is not a literal")


# A string as Python writes it: either quote, backslash escapes, no line break.
_STRING = "(/'([^'\\\\\\n\\r]|\\\\.)*'/ | /\"([^\"\\\\\\n\\r]|\\\\.)*\"/)"


class PythonGrammar(KeyedGrammar):
    """Lark rules of keyword arguments held to their schema: ``key=value`` pairs joined by ``, ``
    in the schema's order, values as Python literals."""

    SEP = '", "'
    ANY_KEY = "/[A-Za-z_][A-Za-z0-9_]*/"
    SCALAR = {**KeyedGrammar.SCALAR, "boolean": '("True" | "False")', "null": '"None"'}

    def key(self, key: str, depth: int) -> str:
        return json.dumps(key + "=" if depth <= 1 else repr(key) + ": ")

    def any_key(self, depth: int) -> str:
        return f'{self.ANY_KEY} "="' if depth <= 1 else f'{self.string()} ": "'

    def order(self, keys: list[str]) -> list[str]:
        return keys

    def written(self, value: object) -> str:
        return json.dumps(repr(value), ensure_ascii=False)

    def string(self) -> str:
        return _STRING
