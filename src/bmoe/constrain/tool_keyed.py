"""Arguments in a keyed notation (``args="keyed"``, Gemma 4): ``key:value`` pairs joined by
``,``, keys unquoted and in sorted order (case folded, as Jinja's ``dictsort``), a string
between the format's quote marks (``<|"|>``), objects ``{k:v,...}`` and arrays ``[v,...]``
nested, numbers and booleans as their text; no whitespace anywhere.

Writing, reading back and the grammar of a value from its schema, each over the same notation.
The grammar follows ``properties`` (sorted; required ones not left out, no other keys),
``items``, ``enum``/``const``, ``$ref`` and the scalar kinds; a value of no single kind takes
any value of the notation.
"""

from __future__ import annotations

import json
import re
from typing import Protocol

from bmoe.constrain.tool_spec import resolve

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_KEY = re.compile(r"[^:,{}\[\]]+")


def sorted_items(value: dict) -> list[tuple[str, object]]:
    """A mapping's items as the notation orders them (Jinja's ``dictsort``: case folded)."""
    return sorted(value.items(), key=lambda kv: str(kv[0]).lower())


def write_keyed(value: object, quote: str) -> str:
    """``value`` in the notation."""
    if isinstance(value, str):
        return quote + value + quote
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + write_pairs(value, quote) + "}"
    if isinstance(value, list):
        return "[" + ",".join(write_keyed(v, quote) for v in value) + "]"
    return str(value)


def write_pairs(value: dict, quote: str) -> str:
    """An object's pairs, without its braces (a call's arguments: the call's text has them)."""
    return ",".join(f"{k}:{write_keyed(v, quote)}" for k, v in sorted_items(value))


_WORDS: tuple[tuple[str, object], ...] = (("true", True), ("false", False), ("null", None), ("None", None))


class Short(ValueError):
    """The text ends inside the value."""


def read_pairs(text: str, at: int, quote: str, end: str) -> tuple[dict, int]:
    """An object's pairs from ``at`` up to the text ``end`` (not read); where they end."""
    out: dict = {}
    while not text.startswith(end, at):
        if end.startswith(text[at:]):  # the text ends here, or inside ``end``
            raise Short()
        if out:
            if text[at] != ",":
                raise ValueError(f"expected ',' or {end!r} at {text[at : at + 20]!r}")
            at += 1
        key = _KEY.match(text, at)
        if key is None or not text.startswith(":", key.end()):
            if key is not None and key.end() == len(text) or at == len(text):
                raise Short()
            raise ValueError(f"expected a key and ':' at {text[at : at + 20]!r}")
        out[key.group(0)], at = read_keyed(text, key.end() + 1, quote)
    return out, at


def read_keyed(text: str, at: int, quote: str) -> tuple[object, int]:
    """One value from ``at``; where it ends."""
    if at >= len(text):
        raise Short()
    if text.startswith(quote, at):
        close = text.find(quote, at + len(quote))
        if close < 0:
            raise Short()
        return text[at + len(quote) : close], close + len(quote)
    if text[at] == "{":
        value, at = read_pairs(text, at + 1, quote, "}")
        return value, at + 1
    if text[at] == "[":
        items: list = []
        at += 1
        while not text.startswith("]", at):
            if items:
                if at >= len(text):
                    raise Short()
                if text[at] != ",":
                    raise ValueError(f"expected ',' or ']' at {text[at : at + 20]!r}")
                at += 1
            item, at = read_keyed(text, at, quote)
            items.append(item)
        return items, at + 1
    for word, scalar in _WORDS:
        if text.startswith(word, at):
            return scalar, at + len(word)
    num = _NUMBER.match(text, at)
    if num is None:
        raise ValueError(f"not a value at {text[at : at + 20]!r}")
    if num.end() == len(text):
        raise Short()
    return json.loads(num.group(0)), num.end()


class Grammar(Protocol):  # tool_grammar's _Lark, as this module uses it
    def lit(self, text: str, **holes: str) -> str: ...
    def rule(self, name: str, body: str) -> str: ...
    def text_until(self, close: str) -> str: ...


_SCALAR = {
    "integer": "/-?(0|[1-9][0-9]*)/",
    "number": "/-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][-+]?[0-9]+)?/",
    "boolean": '("true" | "false")',
    "null": '"null"',
}
_DEPTH = 8
_EMPTY = '""'


class KeyedGrammar:
    """Lark rules of values in the notation, held to their schema (``root``: the tool's
    parameters, for ``$ref``). A notation of the same shape (tool_python's Python keyword calls)
    overrides the hooks: a pair's key text, the keys' order, the separator, strings, scalars."""

    SEP = '","'  # between two pairs or items
    ANY_KEY = "/[A-Za-z0-9_.$-]+/"
    SCALAR = _SCALAR

    def __init__(self, g: Grammar, quote: str, root: object, prefix: str) -> None:
        self.g, self.quote, self.root, self.p = g, quote, root, prefix  # ``prefix``: of its rules' names
        self._n = 0

    def _name(self, what: str) -> str:
        self._n += 1
        return f"{self.p}{what}{self._n}"

    def key(self, key: str, depth: int) -> str:
        """A pair's text before its value (``depth`` 1: the call's own arguments)."""
        return json.dumps(key + ":")

    def any_key(self, depth: int) -> str:
        """Any pair's text before its value, as a Lark sequence."""
        return f'{self.ANY_KEY} ":"'

    def order(self, keys: list[str]) -> list[str]:
        return sorted(keys, key=str.lower)

    def written(self, value: object) -> str:
        """An enum value as a Lark sequence of its written text."""
        return self._quoted(json.dumps(write_keyed(value, "\x00"), ensure_ascii=False))

    def pairs(self, schema: object, depth: int = 0) -> str:
        """An object's pairs (no braces): its declared keys in the notation's order, each optional
        one free to be left out, a separator between two."""
        s = resolve(schema, self.root)
        props = s.get("properties") if isinstance(s, dict) else None
        if not isinstance(s, dict) or not props:
            return self.any_pairs(depth)
        required = set(s.get("required") or ())
        first = more = ""  # rules of the pairs from a key on: none written before it / some
        for key in reversed(self.order(list(props))):
            pair = f"{self.key(key, depth + 1)} {self.value(props[key], depth + 1)}"
            after = f" {more}" if more else ""
            skip = key not in required
            first = self.g.rule(self._name("f"), " | ".join([pair + after] + ([first or _EMPTY] if skip else [])))
            more = self.g.rule(
                self._name("m"), " | ".join([f"{self.SEP} {pair}{after}"] + ([more or _EMPTY] if skip else []))
            )
        return first

    def string(self) -> str:
        return f"{self.g.lit(self.quote)} {self.g.text_until(self.quote)}"

    def value(self, schema: object, depth: int) -> str:
        s = resolve(schema, self.root)
        if not isinstance(s, dict) or depth > _DEPTH:
            return self.any_value()
        if "enum" in s or "const" in s:
            values = s["enum"] if "enum" in s else [s["const"]]
            return "(" + " | ".join(dict.fromkeys(self.written(v) for v in values)) + ")"
        kind = s.get("type") if isinstance(s.get("type"), str) else None  # a type list: no single kind
        if kind == "string":
            return self.string()
        if kind in self.SCALAR:
            return self.SCALAR[kind]
        if kind == "object":
            return f'"{{" {self.pairs(s, depth)} "}}"'
        if kind == "array" and "items" in s:
            item = self.value(s["items"], depth + 1)
            return f'"[" ({item} ({self.SEP} {item})*)? "]"'
        return self.any_value()

    def _quoted(self, alt: str) -> str:
        """An enum value's written text (its quote marks as ``\\x00``) as a Lark sequence."""
        text = json.loads(alt)
        return self.g.lit(text.replace("\x00", self.quote)) if "\x00" in text else alt

    def any_value(self) -> str:
        """Any value of the notation (a schema the grammar does not follow)."""
        if not hasattr(self, "_any"):
            self._any = any_ = f"{self.p}any"
            pairs = self.any_pairs(1)
            scalars = " | ".join(self.SCALAR[k] for k in ("number", "boolean", "null"))
            body = f'{self.string()} | {scalars} | "{{" {pairs} "}}" | "[" ({any_} ({self.SEP} {any_})*)? "]"'
            self.g.rule(any_, body)
        return self._any

    def any_pairs(self, depth: int) -> str:
        """Any pairs (no braces); ``depth`` 0: a call's arguments."""
        name = f"{self.p}anypairs{min(depth, 1)}"
        if name not in getattr(self, "_made", set()):
            self._made = {*getattr(self, "_made", set()), name}
            any_, key = f"{self.p}any", self.any_key(depth + 1)
            self.g.rule(name, f"({key} {any_} ({self.SEP} {key} {any_})*)?")
            self.any_value()
        return name
