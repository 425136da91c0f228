#!/usr/bin/env bash
# The whole check: lint, layering contracts, then the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet -d /tmp/episub-site
exec .venv/bin/python -m pytest "$@"
