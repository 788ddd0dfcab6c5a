"""The decide policy imports nothing of the engine.

Only the engine side of the package (the ``llama_backend`` adapter) may reach llama.cpp; everything else in ``bmoe.decide`` is
policy over token ids and must stay testable, and reusable, without it. Checked twice: statically
(every import statement, including ones inside functions) and by importing the package in a
fresh interpreter in which the engine cannot be imported at all.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import bmoe.decide

PACKAGE_DIR = Path(bmoe.decide.__file__).parent
# The engine side of the package: the one adapter over the live llama.cpp context.
# Every other module is policy.
ADAPTERS = {"llama_backend"}
ALLOWED_THIRD_PARTY = {"numpy"}
ALLOWED_BMOE = {"bmoe.numerics"}
FORBIDDEN = ("llama_cpp", "ctypes", "bmoe.llama", "bmoe.session", "bmoe.stream")


def policy_modules() -> list[Path]:
    return sorted(p for p in PACKAGE_DIR.glob("*.py") if p.stem not in ADAPTERS)


def imported_names(path: Path) -> list[str]:
    """Absolute module names of every import in ``path``, relative ones resolved."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = ["bmoe", "decide"]  # every checked file sits directly in bmoe/decide
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.append(module)
            if node.module is None or node.level:
                # "from . import x" names a module x; include it so it is checked too.
                names.extend(f"{module}.{alias.name}" for alias in node.names)
    return names


def allowed(name: str) -> bool:
    top = name.split(".")[0]
    if name == "bmoe.decide":
        return True
    if name.startswith("bmoe.decide."):
        return name.split(".")[2] not in ADAPTERS
    if top == "bmoe":
        return name in ALLOWED_BMOE
    if top == "ctypes":
        return False
    return top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY or top == "__future__"


def test_there_are_policy_modules_to_check() -> None:
    stems = {p.stem for p in policy_modules()}
    assert {"port", "types", "prompt_split", "choice_scorer", "prefix_cache", "decider"} <= stems


def test_policy_modules_import_only_stdlib_numpy_and_numerics() -> None:
    offenders = {
        p.name: [n for n in imported_names(p) if not allowed(n)] for p in policy_modules()
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_import_rule_would_catch_an_engine_import() -> None:
    # The checker itself must be able to fail.
    for name in ("llama_cpp", "ctypes", "bmoe.llama.context", "bmoe.session", "bmoe.stream.reader",
                 "bmoe.decide.llama_backend", "bmoe.decide_service", "bmoe.config"):
        assert not allowed(name), name
    for name in ("numpy", "bmoe.numerics", "bmoe.decide.port", "dataclasses", "__future__"):
        assert allowed(name), name


def test_importing_the_policy_loads_no_engine_module() -> None:
    modules = ", ".join(repr(f"bmoe.decide.{p.stem}") for p in policy_modules() if p.stem != "__init__")
    script = textwrap.dedent(
        f"""
        import importlib, importlib.abc, sys
        import numpy  # numpy itself loads ctypes; that is not the policy's doing
        before = set(sys.modules)

        FORBIDDEN = {FORBIDDEN!r}

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                    raise ImportError(f"the decide policy imported {{name}}")
                return None

        sys.meta_path.insert(0, Block())
        for name in ["bmoe.decide", {modules}]:
            importlib.import_module(name)
        new = set(sys.modules) - before
        loaded = sorted(m for m in new if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
        assert loaded == [], loaded
        print("ok")
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"
