#!/usr/bin/env bash
# Set up (with the test extras) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
# The layering is a contract (pyproject.toml [tool.importlinter]); an import pointing the wrong way fails here.
.venv/bin/lint-imports
exec .venv/bin/python -m pytest -q tests "$@"
