"""A model's output text in a tool-call format, read back into OpenAI ``tool_calls``.

``parse_tool_calls`` reads a whole answer: the text before the calls is the message's content, then the
calls as the format writes them (tool_formats). Whitespace is read loosely (a run of spaces or
newlines where the format writes one, or none, also after JSON's ``{ [ , :``), everything else
exactly. ``ToolStream`` reads streamed deltas: text is passed on as it comes (held back only
where it may be the start of the calls), each call as soon as its closing text is read.

A call that does not read is a ``ToolCallError`` naming the call and what was wrong.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bmoe.constrain.tool_formats import ToolFormat, fill, native_id, parts
from bmoe.constrain.tool_keyed import Short, read_pairs
from bmoe.constrain.tool_python import read_kwargs
from bmoe.constrain.tool_spec import Tool, ToolCall, resolve
from bmoe.errors import BmoeError

_HOLES = {
    "name": r"[^\s\"'<>\[\]{}():,=]+",
    "index": r"\d+",
    "id": r"[A-Za-z0-9_.-]+",
    "key": r"[^\s\"<>=]+",
    "string": r"true|false",
    "type": r"boolean|null|number|string|object|array",
}


class ToolCallError(BmoeError, ValueError):
    """The model's output holds tool calls that do not read in its format."""


def _rx(text: str) -> str:
    """The regex of a format's text: its holes as named groups, whitespace read loosely."""
    out: list[str] = []
    for part, hole in parts(text):
        if hole:
            out.append(f"(?P<{hole}>{_HOLES[hole]})")
            continue
        for chunk in re.split(r"(\s+)", part):
            if chunk.isspace():
                out.append(r"\s*")
            for c in chunk if not chunk.isspace() else "":
                out.append(re.escape(c) + (r"\s*" if c in "{[,:" else ""))
    return "".join(out)


@dataclass(frozen=True)
class _Rx:
    section_open: re.Pattern
    section_close: re.Pattern
    separator: re.Pattern
    call_open: re.Pattern
    call_close: re.Pattern
    param_open: re.Pattern
    param_close: re.Pattern
    opener: re.Pattern


_CACHE: dict[str, _Rx] = {}


def _compiled(fmt: ToolFormat) -> _Rx:
    if fmt.name not in _CACHE:
        c = {k: re.compile(r"\s*" + _rx(getattr(fmt, k))) for k in _Rx.__dataclass_fields__ if k != "opener"}
        _CACHE[fmt.name] = _Rx(**c, opener=re.compile(_rx(fmt.opener)))
    return _CACHE[fmt.name]


@dataclass
class Parsed:
    """``content``: the text before the calls (stripped where calls follow; the whole text where
    none do); ``calls``: in order."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    end: int = 0  # where reading stopped (ToolStream)


def new_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def parse_tool_calls(
    fmt: ToolFormat, text: str, tools: Sequence[Tool] = (), make_id: Callable[[], str] = new_id
) -> Parsed:
    """The content and calls of a whole answer ``text``; ToolCallError where calls do not read.
    With ``tools``, a call must name one of them."""
    m = _compiled(fmt).opener.search(text)
    if m is None:
        return Parsed(text.removeprefix(fmt.text_open) if fmt.text_open else text, [], len(text))
    return _calls(fmt, text, m.start(), tools, make_id, final=True)


def _calls(
    fmt: ToolFormat, text: str, start: int, tools: Sequence[Tool], make_id: Callable[[], str], *, final: bool
) -> Parsed:
    rx, schemas = _compiled(fmt), {t.name: t.parameters for t in tools}
    out = Parsed(text[:start].strip(), [], start)
    pos = start
    if fmt.section_open:
        pos = rx.section_open.match(text, pos).end()  # type: ignore[union-attr]  # the opener matched
    while True:
        n = len(out.calls) + 1
        at = pos
        if out.calls and fmt.separator:
            sep = rx.separator.match(text, at)
            at = sep.end() if sep else at
        head = rx.call_open.match(text, at)
        if head is None or (out.calls and not fmt.parallel):
            break
        name = head.group("name")
        if not final and head.end() == len(text):  # the name may go on
            return out
        if tools and name not in schemas:
            if not final:
                return out
            raise ToolCallError(f"tool call {n} names {name!r}, which is not one of the tools")
        schema = schemas.get(name, True)
        try:
            read = {"json": _json_args, "xml": _xml_args, "keyed": _keyed_args, "python": _python_args}[fmt.args]
            args, at = read(fmt, text, head.end(), schema)
        except _Short:
            if final:
                raise ToolCallError(f"tool call {n} ({name}): the answer ends inside its arguments") from None
            return out
        except ValueError as e:
            if final:
                raise ToolCallError(f"tool call {n} ({name}): {e}") from None
            return out
        tail = rx.call_close.match(text, at)
        if tail is None:
            if final:
                raise ToolCallError(
                    f"tool call {n} ({name}): expected {fill(fmt.call_close).strip()!r} after its arguments"
                )
            return out
        groups = {**head.groupdict(), **tail.groupdict()}
        if fmt.name == "kimi-k2":
            cid = f"functions.{name}:{groups.get('index')}"
        else:
            cid = groups.get("id") or native_id(fmt, make_id())
        out.calls.append(ToolCall(cid, name, json.dumps(args, ensure_ascii=False)))
        pos = out.end = tail.end()
    if fmt.section_close:
        close = rx.section_close.match(text, pos)
        if close is None:
            if final:
                raise ToolCallError(f"the tool calls do not end with {fmt.section_close.strip()!r}")
            return out
        pos = close.end()
    out.end = pos
    if final and not out.calls:
        raise ToolCallError(f"the tool calls begin ({fmt.opener.strip()!r}) but no call reads after it")
    if final and text[pos:].strip():
        raise ToolCallError(f"unexpected text after the tool calls: {text[pos:].strip()[:60]!r}")
    return out


class _Short(ValueError):
    """The text ends before the arguments do."""


def _json_args(fmt: ToolFormat, text: str, at: int, schema: object) -> tuple[dict, int]:
    at = re.compile(r"\s*").match(text, at).end()  # type: ignore[union-attr]
    try:
        value, end = json.JSONDecoder().raw_decode(text, at)
    except json.JSONDecodeError as e:
        if e.pos >= len(text) or e.msg.startswith("Unterminated string") or not text[at:].strip():
            raise _Short() from None
        raise ValueError(f"its arguments are not JSON ({e.msg} at {text[e.pos : e.pos + 20]!r})") from None
    if not isinstance(value, dict):
        raise ValueError("its arguments are not a JSON object")
    return value, end


def _keyed_args(fmt: ToolFormat, text: str, at: int, schema: object) -> tuple[dict, int]:
    try:
        return read_pairs(text, at, fmt.quote, fill(fmt.call_close))
    except Short:
        raise _Short() from None


def _python_args(fmt: ToolFormat, text: str, at: int, schema: object) -> tuple[dict, int]:
    try:
        return read_kwargs(text, at)
    except Short:
        raise _Short() from None


def _xml_args(fmt: ToolFormat, text: str, at: int, schema: object) -> tuple[dict, int]:
    rx, args = _compiled(fmt), {}
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    while (m := rx.param_open.match(text, at)) is not None and not m.group("key").startswith("/"):
        key, holes = m.group("key"), m.groupdict()
        if fmt.values == "xml":
            args[key], at = _element(fmt, text, m.end(), key, props.get(key), schema)
            continue
        close = rx.param_close.search(text, m.end())
        if close is None:
            raise _Short()
        args[key] = _value(text[m.end() : close.start()], holes.get("string") or holes.get("type"), props.get(key))
        at = close.end()
    if not text[at:].strip():
        raise _Short()
    return args, at


def _kind(schema: object) -> object:
    return schema.get("type") if isinstance(schema, dict) else None


def _element(fmt: ToolFormat, text: str, at: int, key: str, schema: object, root: object) -> tuple[object, int]:
    """A value written as nested elements (``values="xml"``) from ``at``, and where its element
    ends: an object's keys or an array's ``item``s are elements, a scalar is text (read as
    ``_value`` reads it)."""
    close = fill(fmt.param_close, key=key)
    schema = resolve(schema, root)
    kids: list[tuple[str, object]] = []
    pos = at
    if _kind(schema) != "string":
        sub = _compiled(fmt).param_open
        while not text.startswith(close, pos) and (m := sub.match(text, pos)) is not None:
            k = m.group("key")
            if k.startswith("/"):  # another element's close: the text is not well nested
                raise ValueError(f"{key!r} closes with {text[pos : m.end()]!r}")
            kid = None
            if isinstance(schema, dict):
                kid = schema.get("items") if k == "item" and _kind(schema) != "object" else None
                kid = (schema.get("properties") or {}).get(k) if kid is None else kid
            value, pos = _element(fmt, text, m.end(), k, kid, root)
            kids.append((k, value))
    if kids:
        if not text.startswith(close, pos):
            if close.startswith(text[pos:]):
                raise _Short()
            raise ValueError(f"expected {close!r} at {text[pos : pos + 20]!r}")
        if _kind(schema) == "array" or (_kind(schema) != "object" and all(k == "item" for k, _ in kids)):
            return [v for _, v in kids], pos + len(close)
        return dict(kids), pos + len(close)
    end = text.find(close, at)
    if end < 0:
        raise _Short()
    raw = text[at:end]
    if not raw and _kind(schema) in ("object", "array"):  # written as no elements
        return ({} if _kind(schema) == "object" else []), end + len(close)
    return _value(raw, None, schema), end + len(close)


def _value(raw: str, string: str | None, schema: object) -> object:
    """An xml parameter's value: raw text where it is a string (``string`` says, from the
    format's ``{string}`` or ``{type}`` hole, or the schema does), else JSON."""
    kind = _kind(schema)
    if string in ("true", "string") or (
        string is None and (kind == "string" or (isinstance(kind, list) and "string" in kind))
    ):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        if string is not None:
            raise ValueError(f"its value {raw[:40]!r} is marked not a string but is not JSON") from None
        return raw


class ToolStream:
    """Streamed deltas in, OpenAI deltas out: ``("content", text)`` and ``("call", index, ToolCall)``."""

    def __init__(self, fmt: ToolFormat, tools: Sequence[Tool] = (), make_id: Callable[[], str] = new_id) -> None:
        self.fmt, self.tools, self.make_id = fmt, tools, make_id
        self.buf, self.sent, self.start = "", 0, -1
        self.calls: list[ToolCall] = []
        self._head = fmt.opener.split()[0] if fmt.opener.strip() else fmt.opener

    def feed(self, delta: str) -> list[tuple]:
        self.buf += delta
        out: list[tuple] = []
        if self.sent == 0 and self.fmt.text_open:  # a text answer's opening is not content
            if self.fmt.text_open.startswith(self.buf):
                return out
            if self.buf.startswith(self.fmt.text_open):
                self.sent = len(self.fmt.text_open)
        if self.start < 0:
            m = _compiled(self.fmt).opener.search(self.buf, self.sent)
            if m is None:
                safe = self._safe()
                if safe > self.sent:
                    out.append(("content", self.buf[self.sent : safe]))
                    self.sent = safe
                return out
            self.start = m.start()
            if self.buf[self.sent : m.start()].strip():
                out.append(("content", self.buf[self.sent : m.start()].rstrip()))
        got = _calls(self.fmt, self.buf, self.start, self.tools, self._id, final=False)
        return out + self._new(got.calls)

    def finish(self) -> list[tuple]:
        """The rest: the remaining text, or the calls not sent yet (ToolCallError where they do not read)."""
        if self.start < 0:
            rest = self.buf[self.sent :]
            return [("content", rest)] if rest else []
        got = _calls(self.fmt, self.buf, self.start, self.tools, self._id, final=True)
        return self._new(got.calls)

    def _id(self) -> str:  # the same call read again (each feed reads all) keeps its first id
        k = getattr(self, "_k", 0)
        self._k = k + 1
        if k >= len(getattr(self, "_ids", [])):
            self._ids = [*getattr(self, "_ids", []), self.make_id()]
        return self._ids[k]

    def _new(self, calls: list[ToolCall]) -> list[tuple]:
        self._k = 0
        fresh = [("call", i, c) for i, c in enumerate(calls) if i >= len(self.calls)]
        self.calls = list(calls) if len(calls) > len(self.calls) else self.calls
        return fresh

    def _safe(self) -> int:
        """How far the text may be sent: not past where the calls may begin, nor trailing whitespace."""
        at = self.buf.find(self._head, self.sent)
        if at < 0:
            for k in range(min(len(self._head) - 1, len(self.buf) - self.sent), 0, -1):
                if self._head.startswith(self.buf[len(self.buf) - k :]):
                    at = len(self.buf) - k
                    break
        end = len(self.buf) if at < 0 else at
        return len(self.buf[:end].rstrip()) if at < 0 or at > self.sent else self.sent
