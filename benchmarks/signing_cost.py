"""What signed publishing costs: loopback runs with and without --signed, side by side.

    .venv/bin/python benchmarks/signing_cost.py      # prints the markdown table

Reads benchmarks/results/signing_{off,on}_<workload>[_runN].json, written by
`benchmarks/loopback.py --system episub [--signed] ... --out ...` (each file holds its
command). One row per file, runs of a workload interleaved off/on as they were made; then
per workload the mean CPU ms per delivered message off and on, and the difference: what
signing (one signature per publish, one check per node per message) adds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from statistics import mean
from typing import Any

RESULTS = Path(__file__).parent / "results"
_NAME = re.compile(r"signing_(off|on)_(.+?)(?:_run(\d+))?\.json")


def runs() -> list[tuple[str, str, int, dict[str, Any]]]:
    out = []
    for path in RESULTS.glob("signing_*.json"):
        match = _NAME.fullmatch(path.name)
        if match:
            mode, workload, run = match.group(1), match.group(2), int(match.group(3) or 1)
            out.append((workload, mode, run, json.loads(path.read_text())))
    return sorted(out, key=lambda r: (r[0], r[2], r[1]))


def main() -> None:
    rows = runs()
    print(
        "| workload | run | signed | msgs/s per receiver (median) | p50 / p99 ms | delivery |"
        " CPU ms/msg | load avg at start | other CPU s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for workload, mode, run, report in rows:
        s, machine = report["summary"], report["machine"]
        print(
            f"| {workload} | {run} | {mode} | {s['msgs_per_s_per_receiver_median']:.0f} | "
            f"{s['latency_p50_ms']:.0f} / {s['latency_p99_ms']:.0f} | "
            f"{s['delivery_ratio']:.4f} | {s['cpu_s_per_delivered'] * 1000:.3f} | "
            f"{machine['loadavg_at_start'][0]:.2f} | {machine.get('other_cpu_s', 0):.1f} |"
        )
    print()
    print("| workload | CPU ms/msg off (mean) | on (mean) | signing adds |")
    print("|---|---|---|---|")
    for workload in sorted({r[0] for r in rows}):
        cost = {
            mode: mean(
                r[3]["summary"]["cpu_s_per_delivered"] * 1000
                for r in rows
                if r[:2] == (workload, mode)
            )
            for mode in ("off", "on")
            if any(r[:2] == (workload, mode) for r in rows)
        }
        if len(cost) == 2:
            print(
                f"| {workload} | {cost['off']:.3f} | {cost['on']:.3f} | "
                f"{(cost['on'] - cost['off']) * 1000:.0f} µs |"
            )


if __name__ == "__main__":
    main()
