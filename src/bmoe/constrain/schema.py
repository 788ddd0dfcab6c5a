"""JSON schemas as answer constraints: checked, bounded, and compiled by llguidance.

A schema is refused (``ConstraintError``, naming the field and the keyword) when it is not a
schema, when it holds a keyword the engine cannot enforce (never relaxed silently), when a
``$ref`` points nowhere or back into itself, or when it is too big to answer in one request.
Keywords that only annotate (title, description, examples, ...) are accepted and change nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

from llguidance import LLMatcher

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

from bmoe.errors import RequestError

# An enum or a const-list longer than this is refused: the same bound as a decision's work (the
# decide policy's MAX_WORK, one prefill per choice), so that a schema cannot ask more of a turn.
MAX_ENUM = 1024
MAX_NODES = 10_000  # objects (subschemas, object values) in one schema
MAX_DEPTH = 64  # nesting of subschemas

# Keywords the engine enforces; and keywords that only annotate. Anything else is refused.
ENFORCED = frozenset(
    "type enum const properties required additionalProperties items prefixItems minItems maxItems "
    "minLength maxLength pattern format minimum maximum exclusiveMinimum exclusiveMaximum multipleOf "
    "anyOf oneOf allOf $ref $defs definitions minProperties maxProperties patternProperties".split()
)
ANNOTATIONS = frozenset(
    "$schema $id $comment $anchor title description examples default deprecated readOnly writeOnly strict name".split()
)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties")


class ConstraintError(RequestError):
    """A schema or grammar the engine cannot enforce; ``field`` names the request field."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field


def _walk(node: object, path: str, depth: int, field: str) -> Iterator[tuple[str, dict]]:
    """Every subschema object under ``node`` with its JSON pointer, checked for unknown keywords."""
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        raise ConstraintError(
            field, f"{path or '/'} is not a schema (an object or true/false), got {json.dumps(node)[:60]}"
        )
    if depth > MAX_DEPTH:
        raise ConstraintError(field, f"nests deeper than {MAX_DEPTH} subschemas")
    for key in node:
        if key not in ENFORCED and key not in ANNOTATIONS:
            raise ConstraintError(
                field,
                f"keyword {key!r} at {path or '/'} is not supported (bmoe would not enforce it, so it refuses it)",
            )
    yield path, node
    for key in _SCHEMA_MAPS:
        sub = node.get(key)
        if sub is not None and not isinstance(sub, dict):
            raise ConstraintError(field, f"{path}/{key} must be an object of schemas")
        for name, s in (sub or {}).items():
            yield from _walk(s, f"{path}/{key}/{name}", depth + 1, field)
    for key in _SCHEMA_LISTS:
        sub = node.get(key)
        if sub is not None and not isinstance(sub, list):
            raise ConstraintError(field, f"{path}/{key} must be a list of schemas")
        for i, s in enumerate(sub or []):
            yield from _walk(s, f"{path}/{key}/{i}", depth + 1, field)
    for key in _SCHEMA_ONE:
        if key in node:
            yield from _walk(node[key], f"{path}/{key}", depth + 1, field)


def _resolve(root: dict, ref: str, field: str) -> tuple[str, object]:
    if not ref.startswith("#"):
        raise ConstraintError(field, f"$ref {ref!r} is not local (only '#/...' references are followed)")
    node: object = root
    for part in [p.replace("~1", "/").replace("~0", "~") for p in ref[1:].split("/") if p]:
        if not isinstance(node, dict) or part not in node:
            raise ConstraintError(field, f"$ref {ref!r} points to nothing")
        node = node[part]
    return ref[1:], node


def _check_refs(root: dict, nodes: dict[str, dict], field: str) -> None:
    """Refuse a ``$ref`` that leads, through other ``$ref``s or subschemas, back to itself."""

    def reaches(path: str) -> set[str]:  # the pointers of the $ref targets under ``path``
        return {
            _resolve(root, n["$ref"], field)[0]
            for p, n in nodes.items()
            if (p == path or p.startswith(path + "/")) and isinstance(n.get("$ref"), str)
        }

    for p, n in nodes.items():
        ref = n.get("$ref")
        if ref is None:
            continue
        if not isinstance(ref, str):
            raise ConstraintError(field, f"$ref at {p or '/'} must be a string")
        start, _ = _resolve(root, ref, field)
        seen, todo = set(), [start]
        while todo:
            cur = todo.pop()
            if cur in seen:
                continue
            if cur == "" or p == cur or p.startswith(cur + "/"):
                raise ConstraintError(
                    field, f"recursive $ref {ref!r} at {p or '/'} (a schema that contains itself) is not supported"
                )
            seen.add(cur)
            todo.extend(reaches(cur))


def _count(node: object, field: str) -> int:
    n, todo = 0, [node]
    while todo:
        cur = todo.pop()
        if isinstance(cur, dict):
            n += 1
            todo.extend(cur.values())
        elif isinstance(cur, list):
            todo.extend(v for v in cur if isinstance(v, (dict, list)))
        if n > MAX_NODES:
            raise ConstraintError(field, f"holds more than {MAX_NODES} objects")
    return n


def check_schema(schema: object, field: str = "json_schema") -> dict | bool:
    """``schema`` if bmoe can enforce it exactly, else ConstraintError naming ``field``."""
    if not isinstance(schema, (dict, bool)):
        raise ConstraintError(field, f"must be a JSON schema (an object or true/false), got {type(schema).__name__}")
    _count(schema, field)
    nodes = dict(_walk(schema, "", 0, field))
    for p, n in nodes.items():
        enum = n.get("enum")
        if enum is not None and (not isinstance(enum, list) or not enum):
            raise ConstraintError(field, f"enum at {p or '/'} must be a non-empty list")
        if enum is not None and len(enum) > MAX_ENUM:
            raise ConstraintError(
                field, f"enum at {p or '/'} has {len(enum)} values, more than the {MAX_ENUM} one request may hold"
            )
    if isinstance(schema, dict):
        _check_refs(schema, nodes, field)
    return schema


def schema_grammar(schema: object, field: str = "json_schema") -> str:
    """The llguidance grammar of a checked schema; the engine's own refusals name ``field``."""
    checked = check_schema(schema, field)
    # Compact JSON (no whitespace between tokens): a small model given the choice can spend its
    # answer on newlines, and an answer of a finite set is then a decision (constrain/choices.py).
    # (A true/false schema takes no options: it is any JSON value, or none.)
    compact: JsonCompileOptions | None = None if isinstance(checked, bool) else {"whitespace_flexible": False}
    grammar = LLMatcher.grammar_from_json_schema(json.dumps(checked), defaults=compact)
    failed, why = LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        msg = why[0] if why else "refused by the grammar engine"
        msg = " ".join(msg.replace("Unimplemented keys", "unsupported keywords").split())
        raise ConstraintError(field, msg)
    return grammar
