#!/usr/bin/env bash
# The long fuzz run of the frame decoder and the handshake (tests/test_fuzz.py).
# Usage: scripts/fuzz.sh [EXAMPLES_PER_TEST]   (default 2500: ~10-15 min on one core)
# Any exception other than FrameError/HandshakeError fails a test; hypothesis prints the
# shrunk input, which becomes an @example regression case in tests/test_fuzz.py.
set -euo pipefail
cd "$(dirname "$0")/.."
export EPISUB_FUZZ_EXAMPLES="${1:-2500}"
start=$(date +%s)
python -m pytest -q tests/test_fuzz.py --hypothesis-show-statistics "${@:2}"
echo "fuzz: ${EPISUB_FUZZ_EXAMPLES} examples per test, $(( $(date +%s) - start )) s"
