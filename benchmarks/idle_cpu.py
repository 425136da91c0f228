"""What an idle overlay costs: CPU of N `episub node` processes in one topic, no traffic.

    PY=/work/main/.venv/bin/python
    $PY benchmarks/idle_cpu.py --nodes 16 --out benchmarks/results/idle_cpu_n16.json

N processes (`python -m episub.cli node`, the deployment key from EPISUB_KEY) join one
topic through the first; after --settle seconds (joins, the first optimisation rounds),
the user + system CPU of each process is read from /proc/PID/stat at the start and end of
a --window seconds long. What they spend then is the overlay's upkeep: pings, passive
probes, shuffles, stabilisation and the periodic timers. Every process is killed by pid in
a `finally`; every address is on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import free_ports, process_cpu_s, wakeups

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "idle"
FIRST_NODE_GRACE = 1.5  # s for the first node to listen before the others dial it; guess


def measure(nodes: int, settle: float, window: float) -> dict[str, Any]:
    env = {**os.environ, "EPISUB_KEY": "00" * 32, "PYTHONPATH": str(ROOT)}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ports = free_ports(nodes)  # distinct: ports picked one by one can repeat
        first = ports[0]
        for i, port in enumerate(ports):
            argv = [sys.executable, "-m", "episub.cli", "node", "--listen",
                    f"127.0.0.1:{port}", "--topic", TOPIC]  # fmt: skip
            if i:
                argv += ["--bootstrap", f"127.0.0.1:{first}"]
            procs.append(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))  # fmt: skip
            if i == 0:
                time.sleep(FIRST_NODE_GRACE)  # a process starting: there is no event to await
        time.sleep(settle)  # the measurement is of time passing: nothing to await
        dead = [p.pid for p in procs if p.poll() is not None]
        if dead:
            raise SystemExit(f"nodes exited during the settle: {dead}")
        before = [process_cpu_s(p.pid) for p in procs]
        woken_before = [wakeups(p.pid) for p in procs]
        time.sleep(window)
        after = [process_cpu_s(p.pid) for p in procs]
        woken_after = [wakeups(p.pid) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    spent = [b - a for a, b in zip(before, after, strict=True)]
    woken = [
        None if a is None or b is None else b - a
        for a, b in zip(woken_before, woken_after, strict=True)
    ]
    return {
        "nodes": nodes,
        "settle_s": settle,
        "window_s": window,
        "cpu_s_per_node": [round(s, 3) for s in spent],
        "total_core": round(sum(spent) / window, 4),
        "per_node_ms_per_s": round(1000 * sum(spent) / window / nodes, 2),
        "max_node_ms_per_s": round(1000 * max(spent) / window, 2),
        # Times each process blocked and was woken (voluntary context switches) per second.
        "wakeups_per_node_per_s": None if None in woken else round(sum(woken) / window / nodes, 2),  # type: ignore[arg-type]
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--nodes", type=int, default=16, help="node processes")
    p.add_argument("--settle", type=float, default=20.0, help="s before measuring")
    p.add_argument("--window", type=float, default=30.0, help="s measured")
    p.add_argument("--out", help="also write the result JSON here")
    args = p.parse_args(argv)
    if args.nodes < 1 or args.settle < 0 or args.window <= 0:
        p.error("--nodes must be positive, --settle not negative, --window positive")
    result = measure(args.nodes, args.settle, args.window)
    result["command"] = shlex.join([Path(sys.executable).as_posix(), "benchmarks/idle_cpu.py",
                                    *(sys.argv[1:] if argv is None else argv)])  # fmt: skip
    print(f"idle nodes={result['nodes']} window={args.window:g} s: "
          f"{result['per_node_ms_per_s']} ms CPU per node per second "
          f"(max {result['max_node_ms_per_s']}), {result['total_core']} core in all, "
          f"{result['wakeups_per_node_per_s']} wakeups per node per second")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
