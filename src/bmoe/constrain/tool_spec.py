"""OpenAI's ``tools``, ``tool_choice`` and the history's ``tool_calls``, checked into records.

Each refusal is a ``ConstraintError`` (a RequestError: HTTP 400) whose message starts with the
request field it is about, so the caller's session stays usable (docs/server.md "Tools").
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bmoe.constrain.schema import ConstraintError, check_schema

# OpenAI's own bounds: at most 128 tools in one request, names of 1-64 letters, digits, _ and -.
# The bound keeps the prompt (every tool's schema is rendered into it) and the grammar (one
# alternative per tool) small enough to compile within a request.
MAX_TOOLS = 128
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ANY_OBJECT = {"type": "object"}  # a tool without ``parameters`` takes any JSON object


@dataclass(frozen=True, slots=True)
class Tool:
    """One function a model may call: its ``name``, ``description`` and ``parameters`` schema."""

    name: str
    description: str = ""
    parameters: dict | bool = True

    def openai(self) -> dict:
        """The OpenAI function record, as chat templates take it in ``tools``: a description left
        out is an empty one (templates such as gpt-oss's and Hermes 3's add it to a string, which
        an undefined value refuses)."""
        parameters = self.parameters if isinstance(self.parameters, dict) else ANY_OBJECT
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": parameters},
        }


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the assistant made (history) or makes (parsed output): ``arguments`` is JSON text,
    as OpenAI's ``function.arguments``."""

    id: str
    name: str
    arguments: str = "{}"

    def args(self) -> dict:
        """The arguments as an object (they were checked to be one)."""
        value = json.loads(self.arguments)
        return value if isinstance(value, dict) else {}

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """``mode``: "auto" (text or calls), "none" (text only), "required" (one call or more) or
    "named" (a call of ``name`` only)."""

    mode: str = "auto"
    name: str | None = None


def resolve(schema: object, root: object) -> object:
    """``schema``, or the definition of ``root`` (a tool's parameters) its local ``$ref`` names."""
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/")) and isinstance(root, dict):
        _, where, name = ref.split("/", 2)
        return (root.get(where) or {}).get(name, True)
    return schema


def parse_tools(tools: object, field: str = "tools") -> tuple[Tool, ...]:
    """The tools of an OpenAI ``tools`` list (None or [] is no tools)."""
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise ConstraintError(field, "must be a list of {'type': 'function', 'function': {...}} objects")
    if len(tools) > MAX_TOOLS:
        raise ConstraintError(field, f"holds {len(tools)} tools, more than the {MAX_TOOLS} one request may hold")
    out: list[Tool] = []
    seen: dict[str, int] = {}
    for i, t in enumerate(tools):
        at = f"{field}[{i}]"
        if (
            not isinstance(t, dict)
            or t.get("type", "function") != "function"
            or not isinstance(t.get("function"), dict)
        ):
            raise ConstraintError(at, "must be {'type': 'function', 'function': {'name': ..., 'parameters': ...}}")
        fn = t["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ConstraintError(f"{at}.function.name", f"must be 1 to 64 letters, digits, '_' or '-', got {name!r}")
        if name in seen:
            raise ConstraintError(f"{at}.function.name", f"duplicate tool name {name!r} (also tools[{seen[name]}])")
        seen[name] = i
        desc = fn.get("description") or ""
        if not isinstance(desc, str):
            raise ConstraintError(f"{at}.function.description", "must be a string")
        params = fn.get("parameters", True)
        check_schema(params, f"{at}.function.parameters")
        if isinstance(params, dict) and params.get("type", "object") != "object":
            raise ConstraintError(f"{at}.function.parameters", "must be an object schema (type 'object')")
        out.append(Tool(name, desc, params))
    return tuple(out)


def parse_choice(choice: object, tools: Sequence[Tool], field: str = "tool_choice") -> ToolChoice:
    """OpenAI's ``tool_choice``: None (auto with tools, none without), "auto", "none",
    "required" or {"type": "function", "function": {"name": ...}}."""
    if choice is None:
        return ToolChoice("auto" if tools else "none")
    if choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise ConstraintError(field, "'required' needs at least one tool in tools")
        return ToolChoice(str(choice))
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ConstraintError(
            field, "must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}"
        )
    names = [t.name for t in tools]
    if fn["name"] not in names:
        raise ConstraintError(f"{field}.function.name", f"{fn['name']!r} is not one of the tools ({_listed(names)})")
    return ToolChoice("named", fn["name"])


def parse_call(call: object, tools: Sequence[Tool], field: str) -> ToolCall:
    """One OpenAI tool call of the history, checked against ``tools``."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise ConstraintError(field, "must be {'id': ..., 'type': 'function', 'function': {'name', 'arguments'}}")
    fn = call["function"]
    names = [t.name for t in tools]
    if fn.get("name") not in names:
        raise ConstraintError(
            f"{field}.function.name", f"{fn.get('name')!r} is not one of the tools ({_listed(names)})"
        )
    args = fn.get("arguments", "{}")
    try:
        value = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ConstraintError(f"{field}.function.arguments", "must be a JSON object (as text)")
    cid = call.get("id")
    if not isinstance(cid, str) or not cid:
        raise ConstraintError(f"{field}.id", "must be a non-empty string")
    return ToolCall(cid, fn["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


def check_history(messages: Iterable[object], tools: Sequence[Tool], field: str = "messages") -> None:
    """Refuse a history whose calls name a tool not in ``tools`` or whose ``role: "tool"``
    message answers no earlier call. ``messages``: records with ``role``, ``tool_calls`` and
    ``tool_call_id`` (bmoe's Message) or OpenAI dicts."""
    ids: set[str] = set()
    for i, m in enumerate(messages):
        get = m.get if isinstance(m, dict) else lambda k, m=m: getattr(m, k, None)
        for j, c in enumerate(get("tool_calls") or ()):
            raw = c.openai() if isinstance(c, ToolCall) else c
            ids.add(parse_call(raw, tools, f"{field}[{i}].tool_calls[{j}]").id)
        if get("role") == "tool":
            tid = get("tool_call_id")
            if tid not in ids:
                raise ConstraintError(f"{field}[{i}].tool_call_id", f"{tid!r} answers no earlier assistant tool call")


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:8])
    return (shown + f", ... {len(names)} in all") if len(names) > 8 else (shown or "there are none")
