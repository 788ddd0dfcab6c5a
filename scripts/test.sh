#!/usr/bin/env bash
# Set up (with the test extras) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
# The layering is a contract (pyproject.toml [tool.importlinter]); an import pointing the wrong way fails here.
.venv/bin/lint-imports
# ruff's lint ([tool.ruff.lint]: pyflakes' checks, import order, absolute imports only): a name a
# rarely taken path uses but never imported fails here, not in a user's session.
.venv/bin/ruff check src bench tests scripts
# The one format, checked (`ruff format src bench tests scripts` applies it).
.venv/bin/ruff format --check src bench tests scripts
# The annotations, checked ([tool.mypy]: src/bmoe).
.venv/bin/mypy
# Two workers, each test file on one of them (its module fixtures computed once): most tests run
# llama.cpp on one thread, so the two cores run two files at a time (docs/testing.md).
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile tests "$@"
