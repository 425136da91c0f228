#!/usr/bin/env bash
# The whole check: lint, layering contracts, types, the documentation, then the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports
.venv/bin/mypy  # over episub and spark_connector ([tool.mypy] in pyproject.toml)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet -d /tmp/episub-site
# The benchmarks' own tests (the pictures of docs/benchmarks.md drawn from their results among
# them), in a session of their own: the product suite never puts benchmarks/ on its path.
.venv/bin/python -m pytest -q -p no:cacheprovider benchmarks/tests
exec .venv/bin/python -m pytest --durations=40 "$@"
