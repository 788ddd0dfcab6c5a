"""The grammar of an answer with tools: the format's own call syntax, each tool's arguments held
to its JSON parameter schema, compiled by llguidance (Lark syntax with ``%json{...}``).

``tool_choice`` shapes it: "required" is one call or more (one where the format or
``parallel_tool_calls: false`` allows only one), a named tool is one call of that tool, "auto" is
text without the format's opener, or text then the calls; "none" is no grammar (plain text).
Arguments of an xml format (GLM, MiniMax, DSML, Qwen3-Coder) are one element per parameter in
the schema's order: a string parameter is raw text up to the element's closing text, any other
is JSON of its own schema.

A marker that is one special token of the model's vocabulary (``<|tool_call_begin|>``,
``[TOOL_CALLS]``) must be generated as that token, not its text: the engine passes ``special``,
each such marker's token id (``markers`` lists the candidates of a format).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Literal

from llguidance import LLMatcher

from bmoe.constrain.constraint import Constraint
from bmoe.constrain.schema import ConstraintError
from bmoe.constrain.tool_formats import ToolFormat, fill, fixed, json_type, parts, write_value
from bmoe.constrain.tool_keyed import KeyedGrammar
from bmoe.constrain.tool_python import PythonGrammar
from bmoe.constrain.tool_spec import ANY_OBJECT, Tool, ToolChoice, resolve

# JSON arguments as models write them (``json.dumps``'s separators), with no free whitespace: a
# whitespace run is valid JSON that a small model can repeat until max_tokens.
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _json(schema: dict | bool) -> str:
    """The Lark ``%json`` of ``schema``, written compactly (``_COMPACT``)."""
    value = {**schema, "x-guidance": _COMPACT} if isinstance(schema, dict) else schema
    return "%json" + json.dumps(value, ensure_ascii=False)


def _declared_only(schema: dict) -> dict:
    """A tool's arguments hold its declared parameters only, where its schema declares some and
    does not say whether others may come (clients leave ``additionalProperties`` out; a small
    model then writes made-up keys). Every answer still validates against the schema as given."""
    if "properties" in schema and "additionalProperties" not in schema:
        return {**schema, "additionalProperties": False}
    return schema


_MARKER = re.compile(r"<\|[^|<>]+\|>|<｜[^｜<>]+｜>|\[[A-Z_]+\]|\]<\][a-z]+\[>\[|<\|[a-z_]+>|<[a-z_]+\|>")
_DEPTH = 8  # the deepest nesting of a values="xml" argument the grammar follows (then: raw text)
# A scalar as the nested-elements form writes it (Python's text of a number, JSON's booleans).
_SCALAR = {
    "integer": "/-?(0|[1-9][0-9]*)/",
    "number": "/-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][-+]?[0-9]+)?/",
    "boolean": '("true" | "false")',
}


def _choices(schema: object) -> list | None:
    """The values an ``enum`` or ``const`` schema allows (nulls left out: a null is not written)."""
    if not isinstance(schema, dict) or not ("enum" in schema or "const" in schema):
        return None
    values = [v for v in (schema["enum"] if "enum" in schema else [schema["const"]]) if v is not None]
    return values or None


def _is_str(schema: object) -> bool:
    return (
        isinstance(schema, dict) and schema.get("type") == "string" and "enum" not in schema and "const" not in schema
    )


def markers(fmt: ToolFormat) -> set[str]:
    """The texts in ``fmt`` that may be special tokens of a model's vocabulary."""
    texts = [fmt.section_open, fmt.section_close, fmt.call_open, fmt.call_close, fmt.separator]
    texts += [fmt.param_open, fmt.param_close, fmt.quote, fmt.text_open, *fmt.reasoning]
    # a marker followed by line breaks is also a candidate with them (GigaChat 3's vocabulary has
    # ``<|message_sep|>\n\n`` as one token)
    found = [(m.group(0), t[m.end() :]) for t in texts for m in _MARKER.finditer(t)]
    return {m for m, _ in found} | {m + after[: len(after) - len(after.lstrip("\n"))] for m, after in found} - {""}


class _Lark:
    def __init__(self, fmt: ToolFormat, special: Mapping[str, int]) -> None:
        self.fmt, self.special = fmt, dict(special)
        self.rules: list[str] = []
        self.root: dict = {}
        self._n = 0
        self._cut = re.compile("|".join(re.escape(m) for m in sorted(special, key=len, reverse=True)) or "(?!)")

    def lit(self, text: str, **holes: str) -> str:
        """A Lark sequence for ``text``: its holes filled (by Lark expressions), special markers as tokens."""
        out: list[str] = []
        for part, hole in parts(text):
            if hole:
                out.append(holes[hole])
                continue
            at = 0
            for m in self._cut.finditer(part):
                out += [json.dumps(part[at : m.start()], ensure_ascii=False)] if m.start() > at else []
                out.append(f"<[{self.special[m.group(0)]}]>")
                at = m.end()
            out += [json.dumps(part[at:], ensure_ascii=False)] if part[at:] else []
        return " ".join(out) or '""'

    def rule(self, name: str, body: str) -> str:
        """Add rule ``name`` (with its options: ``v[lazy]``); its name to refer to it by."""
        self.rules.append(f"{name}: {body}")
        return name.split("[")[0]

    def args(self, i: int, tool: Tool) -> str:
        if f"args{i}: " in "\n".join(self.rules):
            return f"args{i}"
        schema: dict = tool.parameters if isinstance(tool.parameters, dict) else ANY_OBJECT
        if self.fmt.args == "json":
            return self.rule(f"args{i}", _json(_declared_only(schema)))
        if self.fmt.args in ("keyed", "python"):
            notation = KeyedGrammar if self.fmt.args == "keyed" else PythonGrammar
            return self.rule(f"args{i}", notation(self, self.fmt.quote, schema, f"k{i}_").pairs(schema))
        self.root = schema
        defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
        props: dict = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        parts = []
        for j, (key, sub) in enumerate(props.items()):
            head = self.head(key, self.resolve(sub))
            if isinstance(one := self.resolve(sub), dict) and _choices(one) is not None:
                value = self.choices(key, one)
                head = ""
            elif self.fmt.values == "xml":
                value = self.nested(key, sub, 0)
            elif _is_str(self.resolve(sub)):
                value = self.text_until(fill(self.fmt.param_close, key=key))
            else:
                sub_schema = {**sub, **defs} if isinstance(sub, dict) else sub
                kinds = sub.get("type") if isinstance(sub, dict) else None
                marked = "{type}" in self.fmt.param_open or "{string}" in self.fmt.param_open
                if marked and isinstance(kinds, list) and "string" in kinds and len(kinds) > 1:
                    # a string is marked so and written raw; any other kind is JSON
                    sub_schema = {**sub_schema, "type": [k for k in kinds if k != "string"]}
                    raw = self.lit(self.fmt.param_open, key=json.dumps(key), string='"true"', type='"string"')
                    head = f"({raw} {self.text_until(fill(self.fmt.param_close, key=key))} | {head}"
                value = (
                    self.rule(f"v{i}_{j}", _json(sub_schema))
                    + " "
                    + self.lit(self.fmt.param_close, key=json.dumps(key))
                    + (")" if head.startswith("(") else "")
                )
            parts.append(f"({head} {value})" + ("" if key in required else "?"))
        if not props and schema.get("additionalProperties", True) is not False:
            head = self.lit(self.fmt.param_open, key="/[A-Za-z0-9_.-]+/", string='"true"', type='"string"')
            if "{key}" in self.fmt.param_close:  # a close naming its key: raw text up to any close
                pre = fixed(self.fmt.param_close)
                rest = self.lit(self.fmt.param_close[len(pre) :], key="/[A-Za-z0-9_.-]+/")
                value = f"{self.text_until(fill(pre))} {rest}"
            else:
                value = self.text_until(fill(self.fmt.param_close))
            parts.append(f"({head} {value})*")
        return self.rule(f"args{i}", " ".join(parts) or '""')

    def head(self, key: str, schema: object) -> str:
        """A parameter's opening: its key, and where the format marks it, its value's kind."""
        kind = schema.get("type") if isinstance(schema, dict) else None
        if _is_str(schema):
            type_ = '"string"'
        elif isinstance(kind, str) and kind != "string":
            type_ = json.dumps("number" if kind == "integer" else kind)
        else:  # not known to be one kind: any but string (the value is JSON)
            type_ = '("boolean" | "null" | "number" | "object" | "array")'
        string = '"true"' if _is_str(schema) else '"false"'
        return self.lit(self.fmt.param_open, key=json.dumps(key), string=string, type=type_)

    def choices(self, key: str, schema: dict) -> str:
        """An enum's (or const's) values, each with its own opening (its kind may be marked),
        written as the format writes a value (a string raw)."""
        close = self.lit(self.fmt.param_close, key=json.dumps(key))
        alts = []
        for v in _choices(schema) or ():
            mark = {"string": '"true"' if isinstance(v, str) else '"false"', "type": json.dumps(json_type(v))}
            head = self.lit(self.fmt.param_open, key=json.dumps(key), **mark)
            alts.append(f"{head} {json.dumps(write_value(self.fmt, v), ensure_ascii=False)} {close}")
        return "(" + " | ".join(dict.fromkeys(alts)) + ")"

    def resolve(self, schema: object) -> object:
        return resolve(schema, self.root)

    def text_until(self, close: str) -> str:
        """Raw text up to ``close`` (which it cannot hold), then ``close``."""
        end = self.lit(close)
        if end.startswith("<["):  # a special token: text cannot write it
            return f"/(?s:.*)/ {end}"
        self._n += 1
        return self.rule(f"t{self._n}[suffix={json.dumps(close)}]", "/(?s:.*)/")

    def nested(self, key: str, schema: object, depth: int) -> str:
        """A value written as nested elements (``values="xml"``), then its close: an object's
        declared keys in the schema's order, an array's items, scalars as their text. What the
        text form cannot hold (a string's pattern or length, a number's bounds, an array's length,
        ``anyOf``) is not held; a value of no single kind is raw text."""
        close = self.lit(self.fmt.param_close, key=json.dumps(key))
        s = self.resolve(schema)
        kind = s.get("type") if isinstance(s, dict) and isinstance(s.get("type"), str) else None
        if not isinstance(s, dict) or depth > _DEPTH:
            return self.text_until(fill(self.fmt.param_close, key=key))
        if _choices(s) is not None:
            alts = {json.dumps(write_value(self.fmt, v), ensure_ascii=False) for v in _choices(s) or ()}
            return f"({' | '.join(sorted(alts))}) {close}"
        if kind in _SCALAR:
            return f"{_SCALAR[kind]} {close}"
        if kind == "object" and s.get("properties"):
            required = set(s.get("required") or ())
            kids = [
                f"({self.head(k, self.resolve(sub))} {self.nested(k, sub, depth + 1)})" + ("" if k in required else "?")
                for k, sub in s["properties"].items()
            ]
            return f"{' '.join(kids)} {close}"
        if kind == "array" and "items" in s:
            return (
                f"({self.head('item', self.resolve(s['items']))} {self.nested('item', s['items'], depth + 1)})* {close}"
            )
        return self.text_until(fill(self.fmt.param_close, key=key))

    def call(self, i: int, tool: Tool, skip: int = 0) -> str:
        """Rule of one call of ``tool``; ``skip``: characters of the opening already written."""
        holes = {
            "name": json.dumps(tool.name),
            "index": "/[0-9]{1,4}/",  # bounded: a model that repeats a digit still ends the call
            "id": f"/{self.fmt.id_pattern or '[A-Za-z0-9]{9}'}/",
        }
        head = self.lit(self.fmt.call_open[skip:], **holes) if len(self.fmt.call_open) > skip else ""
        body = f"{head} {self.args(i, tool)} {self.lit(self.fmt.call_close, **holes)}"
        return self.rule(f"call{i}{'_rest' if skip else ''}", body)


def _regex_text(text: str) -> str:
    """``text`` as a regex that matches it, written between Lark's ``/.../``."""
    return "".join("\\" + c if c in "\\.+*?()|[]{}^$#&-~/" else "\\n" if c == "\n" else c for c in text)


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
Think = Literal["", "open", "inside", "closed"]


def _reasoning(g: "_Lark", think: Think, body: str) -> str:
    """``body`` after a reasoning block: the format's own (``ToolFormat.reasoning``: gpt-oss's
    analysis channel) or ``<think>...</think>`` (Qwen3, DeepSeek R1). "open", the answer may start
    with the block; "inside", the prompt opened it, so the answer closes it first; "closed", the
    answer closes it at once (a format whose answers start inside the block, in a turn that does
    not reason: ``ToolFormat.reasoning_first``). The block ends at its first closing text;
    up to 8 whitespace characters may follow a ``</think>``."""
    opening, closing = g.fmt.reasoning if g.fmt.reasoning[0] else (THINK_OPEN, THINK_CLOSE)
    close = g.lit(closing)
    if think == "closed":
        return f"{close} ({body})"
    if close.startswith("<["):  # a special token: the text before it cannot write it
        reasoning = f"/(?s:.*)/ {close}"
    else:
        reasoning = g.rule("reasoning[lazy]", f"/(?s:.*){_regex_text(closing)}/")
    block = reasoning
    if closing == THINK_CLOSE:
        g.rules.append("BLANK: /[ \\t\\r\\n]{1,8}/")  # bounded: a model that repeats a blank still goes on
        block = f"{reasoning} BLANK?"
    if think == "inside":
        return f"{block} ({body})"
    return f"{g.lit(opening)} {block} ({body}) | {body}"


def tool_lark(
    fmt: ToolFormat,
    tools: Sequence[Tool],
    choice: ToolChoice,
    parallel: bool = True,
    special: Mapping[str, int] = {},
    think: Think = "",
) -> str | None:
    """The Lark text of the grammar (None: "none", or no tools); ``think``: a reasoning block
    first (``_reasoning``)."""
    if choice.mode == "none" or not tools:
        return None
    chosen = [t for t in tools if choice.mode != "named" or t.name == choice.name]
    g = _Lark(fmt, special)
    many = parallel and fmt.parallel
    sep = g.lit(fmt.separator) if fmt.separator else ""
    if fmt.section_open:  # the opener is the section's: then calls, then the section's end
        call = g.rule("call", " | ".join(g.call(i, t) for i, t in enumerate(chosen)))
        rest = f"{call} ({sep} {call})*" if many else call
        close = g.lit(fmt.section_close)
        if sep and fmt.section_close.startswith(fmt.separator):  # one lexeme each: the lexer takes no
            close = f"{sep} {g.lit(fmt.section_close[len(fmt.separator) :])}"  # prefix of a longer one back
        rest = g.rule("rest", f"{rest} {close}")
    else:  # the opener is the first call's own start
        skip = len(fixed(fmt.call_open))
        first = g.rule("first", " | ".join(g.call(i, t, skip) for i, t in enumerate(chosen)))
        call = g.rule("call", " | ".join(g.call(i, t) for i, t in enumerate(chosen)))
        rest = g.rule("rest", f"{first} ({sep} {call})*" if many else first)
    opener = g.lit(fmt.opener)
    if choice.mode != "auto":
        start = f"{opener} {rest}"
    elif opener.startswith("<["):  # a special token: text cannot write it
        start = f"TEXT | TEXT {opener} {rest}"
        g.rules.append("TEXT: /(?s:.*)/")
    else:
        esc = _regex_text(fmt.opener)
        g.rules.append(f"TEXT: /(?s:.*)/ & ~/(?s:.*){esc}(?s:.*)/")
        start = f"TEXT | {g.rule('pre[lazy]', f'/(?s:.*){esc}/')} {rest}"
    if choice.mode == "auto" and fmt.text_open:  # a text answer may open as the format's do
        start = f"{g.lit(fmt.text_open)} TEXT | {start}"
    if think:
        start = _reasoning(g, think, start)
    return "\n".join([f"start: {start}", *g.rules]) + "\n"


def tool_constraint(
    fmt: ToolFormat,
    tools: Sequence[Tool],
    choice: ToolChoice,
    parallel: bool = True,
    special: Mapping[str, int] = {},
    think: Think = "",
) -> Constraint | None:
    """The compiled constraint of an answer with tools (None: plain text)."""
    lark = tool_lark(fmt, tools, choice, parallel, special, think)
    if lark is None:
        return None
    grammar = LLMatcher.grammar_from_lark(lark)
    failed, why = LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        raise ConstraintError(
            "tools", "the grammar engine refused the tools' grammar: " + " ".join((why or ["?"])[0].split())
        )
    return Constraint("tools", "tools", grammar)
