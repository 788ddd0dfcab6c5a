#!/usr/bin/env bash
# Set up (with the test extras) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
# The layering is a contract (pyproject.toml [tool.importlinter]); an import pointing the wrong way fails here.
.venv/bin/lint-imports
# pyflakes' checks (undefined names, unused imports, ...): a name a rarely taken path uses but never
# imported fails here, not in a user's session.
.venv/bin/flake8 --select=F src bench tests scripts
exec .venv/bin/python -m pytest -q tests "$@"
