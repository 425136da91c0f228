"""What an idle overlay costs: CPU of N `episub node` processes in one topic, no traffic.

    PY=/work/main/.venv/bin/python
    $PY benchmarks/idle_cpu.py --nodes 16 --out benchmarks/results/idle_cpu_n16.json

N processes (`python -m episub.cli node`, the deployment key from EPISUB_KEY) join one
topic through the first; after --settle seconds (joins, the first optimisation rounds),
each process's CPU is read at the start and end of a --window seconds long, in
nanoseconds over every thread (/proc/PID/task/*/schedstat, _common.process_cpu_ns), and
so are its context switches over every thread (voluntary: it blocked and was woken;
involuntary: it was preempted). What they spend then is the overlay's upkeep: pings,
passive probes, shuffles, stabilisation and the periodic timers. The figures are per
node per second: the mean over nodes (the acceptance figure), and min, median and max.
Every process is killed by pid in a `finally`; every address is on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import free_ports, percentile, process_cpu_ns, process_cpu_s, process_switches

from episub.agent.client import AgentClient

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "idle"
FIRST_NODE_GRACE = 1.5  # s for the first node to listen before the others dial it; guess
PERF_HZ = 4999  # perf's sampling rate with --perf: an idle node is on a CPU ~0.1% of the time


def _counters(sockets: str, nodes: int) -> list[dict[str, int]]:
    """Every node's counters (node.stats()), asked through its agent socket."""
    out = []
    for i in range(nodes):
        with AgentClient(str(Path(sockets) / f"node{i}.sock")) as client:
            out.append(client.inspect().stats)
    return out


def _await_files(paths: list[Path], limit_s: float) -> None:
    """Wait until every profile is written (a process's answer to a signal: no event)."""
    deadline = time.monotonic() + limit_s
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            raise SystemExit(f"profiles not written in {limit_s:g} s")
        time.sleep(0.1)


def _spread(values: list[float]) -> dict[str, float]:
    """Mean, min, median and max of per-node figures, rounded for the report."""
    return {
        "mean": round(sum(values) / len(values), 3),
        "min": round(min(values), 3),
        "median": round(percentile(values, 50), 3),
        "max": round(max(values), 3),
    }


def _reading(pid: int) -> tuple[int, tuple[int, int, int], float]:
    """(CPU ns, (voluntary, involuntary, threads), CPU s in clock ticks) of one node."""
    cpu_ns, switches = process_cpu_ns(pid), process_switches(pid)
    if cpu_ns is None or switches is None:
        raise SystemExit(f"node {pid} exited during the window")
    return cpu_ns, switches, process_cpu_s(pid)


def measure(
    nodes: int,
    settle: float,
    window: float,
    *,
    profile_dir: Path | None = None,
    perf_file: Path | None = None,
    counters: bool = False,
) -> dict[str, Any]:
    env = {**os.environ, "EPISUB_KEY": "00" * 32, "PYTHONPATH": str(ROOT)}
    profiles = [] if profile_dir is None else [profile_dir / f"node{i}.prof" for i in range(nodes)]
    procs: list[subprocess.Popen[bytes]] = []
    sockets = tempfile.mkdtemp(prefix="idle-cpu-")
    try:
        ports = free_ports(nodes)  # distinct: ports picked one by one can repeat
        first = ports[0]
        for i, port in enumerate(ports):
            argv = [sys.executable, "-m", "episub.cli", "node", "--listen",
                    f"127.0.0.1:{port}", "--topic", TOPIC]  # fmt: skip
            if profiles:
                argv[1:3] = [str(ROOT / "benchmarks" / "profiled_node.py"), str(profiles[i])]
            if i:
                argv += ["--bootstrap", f"127.0.0.1:{first}"]
            if counters:
                argv += ["--socket", str(Path(sockets) / f"node{i}.sock")]
            procs.append(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))  # fmt: skip
            if i == 0:
                time.sleep(FIRST_NODE_GRACE)  # a process starting: there is no event to await
        time.sleep(settle)  # the measurement is of time passing: nothing to await
        dead = [p.pid for p in procs if p.poll() is not None]
        if dead:
            raise SystemExit(f"nodes exited during the settle: {dead}")
        counted_before = _counters(sockets, nodes) if counters else []
        load_before = os.getloadavg()
        before = [_reading(p.pid) for p in procs]
        started = time.monotonic()
        for p in procs if profiles else ():
            p.send_signal(signal.SIGUSR1)  # profiled_node.py: start profiling
        if perf_file is not None:
            pids = ",".join(str(p.pid) for p in procs)
            record = ["perf", "record", "-q", "-F", str(PERF_HZ), "-g", "-p", pids,
                      "-o", str(perf_file), "--", "sleep", str(window)]  # fmt: skip
            subprocess.run(record, check=True)
        else:
            time.sleep(window)
        after = [_reading(p.pid) for p in procs]
        elapsed = time.monotonic() - started
        for p in procs if profiles else ():
            p.send_signal(signal.SIGUSR2)  # profiled_node.py: stop and write the profile
        _await_files(profiles, limit_s=30.0)
        load_after = os.getloadavg()
        counted_after = _counters(sockets, nodes) if counters else []
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(sockets, ignore_errors=True)
    counted = {
        name: round(sum(b.get(name, 0) - a.get(name, 0)
                        for a, b in zip(counted_before, counted_after, strict=True))
                    / elapsed / nodes, 3)
        for name in sorted({name for c in counted_after for name in c})
    }  # fmt: skip
    ms_per_s = [(b[0] - a[0]) / 1e6 / elapsed for a, b in zip(before, after, strict=True)]
    voluntary = [(b[1][0] - a[1][0]) / elapsed for a, b in zip(before, after, strict=True)]
    involuntary = [(b[1][1] - a[1][1]) / elapsed for a, b in zip(before, after, strict=True)]
    ticks_s = [b[2] - a[2] for a, b in zip(before, after, strict=True)]
    per_wakeup_us = [
        1000 * cpu / woken if woken else math.nan
        for cpu, woken in zip(ms_per_s, voluntary, strict=True)
    ]
    return {
        "nodes": nodes,
        "settle_s": settle,
        "window_s": round(elapsed, 3),
        # The acceptance figure: CPU ms per node-second, mean over the nodes (schedstat ns).
        "per_node_ms_per_s": round(sum(ms_per_s) / nodes, 3),
        "cpu_ms_per_s": _spread(ms_per_s),
        "max_node_ms_per_s": round(max(ms_per_s), 3),
        "total_core": round(sum(ms_per_s) / 1000, 5),
        # Times a thread blocked and was woken, per node-second (every thread counted).
        "wakeups_per_node_per_s": round(sum(voluntary) / nodes, 3),
        "wakeups_per_s": _spread(voluntary),
        "preemptions_per_node_per_s": round(sum(involuntary) / nodes, 3),
        "cpu_us_per_wakeup": _spread([w for w in per_wakeup_us if not math.isnan(w)] or [0.0]),
        "threads_per_node": sorted({b[1][2] for b in after}),
        # The old reading (/proc/PID/stat, in clock ticks), for comparison with older runs.
        "tick_ms_per_s": round(1000 * sum(ticks_s) / elapsed / nodes, 3),
        "cpu_ms_per_s_per_node": [round(v, 3) for v in ms_per_s],
        # The nodes' own counters (node.stats(), read through the agent socket outside the
        # window), per node-second, those that moved: what an idle node did.
        "counters_per_node_per_s": {k: v for k, v in counted.items() if v},
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--nodes", type=int, default=16, help="node processes")
    p.add_argument("--settle", type=float, default=20.0, help="s before measuring")
    p.add_argument("--window", type=float, default=30.0, help="s measured")
    p.add_argument("--out", help="also write the result JSON here")
    p.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="cProfile every node over the window into DIR/nodeI.prof "
        "(profile_summary.py --idle sums them; the CPU figures then are not)",
    )
    p.add_argument(
        "--counters",
        action="store_true",
        help="serve each node's agent socket and report its counters per "
        "node-second (messages, dials, link changes) over the window",
    )
    p.add_argument("--perf", type=Path, metavar="FILE",
                   help="perf record -g every node over the window into FILE")  # fmt: skip
    args = p.parse_args(argv)
    if args.nodes < 1 or args.settle < 0 or args.window <= 0:
        p.error("--nodes must be positive, --settle not negative, --window positive")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        for stale in args.profile.glob("node*.prof"):
            stale.unlink()
    result = measure(args.nodes, args.settle, args.window, profile_dir=args.profile,
                     perf_file=args.perf, counters=args.counters)  # fmt: skip
    result["command"] = shlex.join([Path(sys.executable).as_posix(), "benchmarks/idle_cpu.py",
                                    *(sys.argv[1:] if argv is None else argv)])  # fmt: skip
    cpu, woken, per = result["cpu_ms_per_s"], result["wakeups_per_s"], result["cpu_us_per_wakeup"]
    print(f"idle nodes={result['nodes']} window={result['window_s']:g} s: "
          f"{result['per_node_ms_per_s']} ms CPU per node per second "
          f"(min {cpu['min']}, median {cpu['median']}, max {cpu['max']}); "
          f"{result['wakeups_per_node_per_s']} wakeups per node per second "
          f"(min {woken['min']}, median {woken['median']}, max {woken['max']}), "
          f"{result['preemptions_per_node_per_s']} preemptions; "
          f"{per['median']} us CPU per wakeup (median); "
          f"threads {result['threads_per_node']}; load {result['load_before']}")  # fmt: skip
    if result["counters_per_node_per_s"]:
        print("per node-second:", ", ".join(f"{k} {v}" for k, v in
                                        result["counters_per_node_per_s"].items()))  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
