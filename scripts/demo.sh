#!/usr/bin/env bash
# The main demo: sets up, then runs examples/quickstart.py: an embedded local Spark
# (local[2]) reads topic "events" through episub, fed by the `episub` command and by a
# writing query. Needs Java 17. The simulator demo: .venv/bin/episub sim steady --nodes 1000
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/quickstart.py "$@"
