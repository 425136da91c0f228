#!/usr/bin/env bash
# The acceptance sitting of docs/benchmarks.md: every comparison, systems interleaved, one
# sitting, under the shared lock. Writes benchmarks/results/sitting/*.json, or into DIR:
#   flock /tmp/episub-heavy.lock bash benchmarks/sitting.sh [DIR]
# PACED_RUNS=1 takes one paced run of each system instead of two (development figures).
# Peers: redis-server (Debian), iroh in its own venv ($IROH_PYTHON, default
# iroh-venv/bin/python: python3 -m venv DIR && DIR/bin/pip install iroh==0.35.0 trio).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
IROH_PYTHON=${IROH_PYTHON:-iroh-venv/bin/python}
R=${1:-benchmarks/results/sitting}
mkdir -p "$R"
export PYTHONPATH=$PWD
uptime > "$R/load_before.txt"
$PY benchmarks/loopback.py --system episub --nodes 8 --size 256 --messages 20000 \
    --out $R/episub_n8_256B_burst20000.json
$PY benchmarks/loopback.py --system episub --nodes 16 --size 4096 --messages 5000 \
    --out $R/episub_n16_4KiB_burst5000.json
for run in $(seq 1 "${PACED_RUNS:-2}"); do
    $PY benchmarks/loopback.py --system episub --nodes 8 --size 256 --messages 1000 --rate 100 \
        --out $R/episub_n8_256B_paced100_run$run.json
    $PY benchmarks/loopback.py --system iroh --python "$IROH_PYTHON" --nodes 8 --size 256 \
        --messages 1000 --rate 100 --out $R/iroh_n8_256B_paced100_run$run.json
done
# Many publishers on one topic (a delivery tree per publisher stream) beside one publisher
# paced at the same total rate, and iroh-gossip's many-publisher run beside them.
for run in 1 2 3; do
    for n in 8 16; do
        $PY benchmarks/loopback.py --system episub --nodes $n --size 256 --messages 1500 \
            --rate 100 --out $R/episub_n${n}_256B_paced100_m1500_run$run.json
        $PY benchmarks/loopback.py --system episub --nodes $n --publishers $n --size 256 \
            --messages 1500 --rate 50 --out $R/episub_n${n}_p${n}_256B_paced50_run$run.json
        $PY benchmarks/loopback.py --system iroh --python "$IROH_PYTHON" --nodes $n \
            --publishers $n --size 256 --messages 1500 --rate 50 \
            --out $R/iroh_n${n}_p${n}_256B_paced50_run$run.json
    done
done
for run in 1 2 3; do
    $PY benchmarks/config_broadcast.py --system episub --nodes 32 --out $R/config_episub_n32_run$run.json
    $PY benchmarks/config_broadcast.py --system redis --nodes 32 --out $R/config_redis_n32_run$run.json
    # Design measurements, not the product: the same readers' core without trio, pumped
    # by the application's thread, then by a thread of its own.
    for proto in episub-blocking episub-thread; do
        $PY benchmarks/config_broadcast.py --system $proto --nodes 32 \
            --out $R/config_${proto}_n32_run$run.json
    done
done
$PY benchmarks/wakeup_floor.py --readers 32 --out $R/wakeup_floor.json
$PY benchmarks/idle_cpu.py --nodes 16 --out $R/idle_cpu_n16.json
$PY benchmarks/retention_memory.py --out $R/retention_memory.json
PROF=$(mktemp -d)
BENCH_PROFILE_DIR=$PROF $PY benchmarks/loopback.py --system episub --nodes 8 --size 256 \
    --messages 20000 --out $PROF/run.json
$PY benchmarks/profile_summary.py "$PROF" "$PROF/run.json" --out $R/profile_after.json
rm -rf "$PROF"
uptime > "$R/load_after.txt"
