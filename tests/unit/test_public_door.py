"""A narrow public door (#40.8): a package's ``__all__`` is what other packages of bmoe may use.

Every ``from bmoe.P... import name`` in a module outside package P must name something in P's
``__all__``: an object, or a public submodule (listed in ``__all__`` by its name), whose own names
are then all usable (``bmoe.decide.port``, the engine port, is one). Held for the packages in
DOORS; the others (runtime, llama, stream, ...) are the engine's insides, used by the layers
right above them (the session, the runtime).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
DOORS = ("bmoe.session", "bmoe.tools", "bmoe.decide", "bmoe.cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path):
    """(target module, imported name) of each ``from ... import`` in ``path``, relative ones resolved."""
    name = _module_name(path)
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                up = base[: len(base) - node.level + 1]
                target = ".".join(up + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                yield target, alias.name, node.lineno


def _door(target: str) -> str | None:
    return next((d for d in DOORS if target == d or target.startswith(d + ".")), None)


def crossings() -> list[tuple[str, str, tuple[str, ...], int]]:
    """(importing module, door, what it imports through it: the name, and the submodule it comes
    from if any, line) for imports into a DOORS package from outside it."""
    out = []
    for path in sorted((SRC / "bmoe").rglob("*.py")):
        importer = _module_name(path)
        for target, name, line in _imports(path):
            door = _door(target)
            if door is None or importer == door or importer.startswith(door + "."):
                continue
            sub = target[len(door) + 1 :].split(".")[0] if target != door else None
            out.append((importer, door, (name,) if sub is None else (name, sub), line))
    return out


def test_other_packages_use_only_what_a_door_lists():
    wrong = []
    for importer, door, what, line in crossings():
        public = getattr(importlib.import_module(door), "__all__", None)
        assert public is not None, f"{door} has no __all__"
        if not set(what) & set(public):
            wrong.append(f"{importer}:{line} uses {door}: {' from '.join(what)}, not in {door}.__all__")
    assert not wrong, "\n".join(wrong)


def test_the_edges_utilities_are_not_the_sessions():
    import bmoe.session
    import bmoe.tools

    assert not set(bmoe.session.__all__) & set(bmoe.tools.__all__)
    for name in ("gc_twins", "format_archs", "list_devices", "footprint", "make_plan"):
        assert name in bmoe.tools.__all__ and name not in bmoe.session.__all__


def test_bmoe_public_api_is_small():
    import bmoe

    assert bmoe.__all__ == ["BmoeError", "DecideRequest", "GenerateRequest", "Session", "SessionConfig"]
    for name in bmoe.__all__:
        assert getattr(bmoe, name).__name__ == name


@pytest.mark.parametrize("door", DOORS)
def test_each_door_lists_what_it_has(door):
    module = importlib.import_module(door)
    for name in module.__all__:
        assert hasattr(module, name) or importlib.util.find_spec(f"{door}.{name}") is not None, f"{door}.{name}"


def test_the_cli_answers_the_sessions_decide_off():
    """The session is the one place that knows decide is off: the line loop answers its refusal
    (each request of a batch gets it, with its id) rather than checking again."""
    from bmoe.cli import loop
    from bmoe.session import DECIDE_OFF, DecideOffError
    from bmoe.wire.protocol import parse_line

    class Off:  # a session opened without decide, as far as the loop can see: only its refusal
        def decide_many(self, requests):
            raise DecideOffError(DECIDE_OFF)

        def decide(self, request):
            raise DecideOffError(DECIDE_OFF)

    lines: list[str] = []
    batch = parse_line('{"cmd":"decide_batch","id":9,"requests":[{"id":1,"choices":["a"]},{"choices":["b"]}]}')
    loop._decide(Off(), batch, lines.append)
    loop._decide(Off(), parse_line('{"cmd":"decide","id":4,"choices":["a"]}'), lines.append)
    assert lines == [f'BMOE_DECIDE {{"id":{i},"error":"{DECIDE_OFF}"}}' for i in (1, 0, 4)]
