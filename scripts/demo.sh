#!/usr/bin/env bash
# The main demo: sets up, then simulates a 1,000-node overlay and prints a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/episub sim steady --nodes 1000 --messages 100 --warmup 50 --seed 1 "$@"
