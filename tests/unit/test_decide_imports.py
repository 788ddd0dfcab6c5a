"""The decide policy imports nothing of the engine, also at run time.

The static rule is an import-linter contract (pyproject.toml, run by ``lint-imports`` in the test
command); it cannot see an import made by name at run time. This imports the whole package in a
fresh interpreter in which the engine cannot be imported at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import bmoe.decide

PACKAGE_DIR = Path(bmoe.decide.__file__).parent
FORBIDDEN = ("llama_cpp", "ctypes", "bmoe.llama", "bmoe.session", "bmoe.stream", "bmoe.runtime", "bmoe.config")


def policy_modules() -> list[Path]:
    return sorted(PACKAGE_DIR.glob("*.py"))


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
