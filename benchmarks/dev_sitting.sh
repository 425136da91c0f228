#!/usr/bin/env bash
# A development sitting: the acceptance benchmarks of docs/benchmarks.md (sitting.sh's
# commands, one paced run of each system instead of two), into a directory of its own, for
# figures during development (not the acceptance sitting: the machine may be shared).
#   flock /tmp/episub-heavy.lock bash benchmarks/dev_sitting.sh benchmarks/results/dev/NAME
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
IROH_PYTHON=${IROH_PYTHON:-/work/iroh-venv/bin/python}
R=${1:?usage: dev_sitting.sh OUTDIR}
mkdir -p "$R"
export PYTHONPATH=$PWD
uptime > "$R/load_before.txt"
$PY benchmarks/loopback.py --system episub --nodes 8 --size 256 --messages 20000 \
    --out $R/episub_n8_256B_burst20000.json
$PY benchmarks/loopback.py --system episub --nodes 16 --size 4096 --messages 5000 \
    --out $R/episub_n16_4KiB_burst5000.json
$PY benchmarks/loopback.py --system episub --nodes 8 --size 256 --messages 1000 --rate 100 \
    --out $R/episub_n8_256B_paced100_run1.json
$PY benchmarks/loopback.py --system iroh --python "$IROH_PYTHON" --nodes 8 --size 256 \
    --messages 1000 --rate 100 --out $R/iroh_n8_256B_paced100_run1.json
for run in 1 2 3; do
    $PY benchmarks/config_broadcast.py --system episub --nodes 32 --out $R/config_episub_n32_run$run.json
    $PY benchmarks/config_broadcast.py --system redis --nodes 32 --out $R/config_redis_n32_run$run.json
done
$PY benchmarks/idle_cpu.py --nodes 16 --out $R/idle_cpu_n16.json
$PY benchmarks/retention_memory.py --out $R/retention_memory.json
PROF=$(mktemp -d)
BENCH_PROFILE_DIR=$PROF $PY benchmarks/loopback.py --system episub --nodes 8 --size 256 \
    --messages 20000 --out $PROF/run.json
$PY benchmarks/profile_summary.py "$PROF" "$PROF/run.json" --out $R/profile.json
rm -rf "$PROF"
uptime > "$R/load_after.txt"
