"""Side by side: episub against py-libp2p gossipsub, from benchmarks/results/*.json.

    .venv/bin/python benchmarks/loopback_compare.py      # prints the markdown table

Pairs the files `<system>_<workload>.json` written by loopback.py with the same workload
name; a workload run by one system only gets its row with dashes for the other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
SYSTEMS = ("gossipsub", "episub")


def load(system: str, workload: str) -> dict[str, Any] | None:
    path = RESULTS / f"{system}_{workload}.json"
    return json.loads(path.read_text())["summary"] if path.exists() else None


def cell(summary: dict[str, Any] | None, key: str, fmt: str) -> str:
    value = None if summary is None else summary.get(key)
    return "-" if value is None else format(value, fmt)


def main() -> None:
    workloads = sorted(
        {p.stem.split("_", 1)[1] for s in SYSTEMS for p in RESULTS.glob(f"{s}_n*.json")},
        key=lambda w: (int(w.split("_")[0][1:]), w),
    )
    print(
        "| workload | system | msgs/s per receiver (median) | p50 / p99 ms | delivery |"
        " copies/msg | wire B/msg | CPU ms/msg | episub ÷ gossipsub msgs/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for workload in workloads:
        runs = {s: load(s, workload) for s in SYSTEMS}
        ratio = "-"
        g, e = runs["gossipsub"], runs["episub"]
        if g and e and g["msgs_per_s_per_receiver_median"]:
            ratio = (
                f"{e['msgs_per_s_per_receiver_median'] / g['msgs_per_s_per_receiver_median']:.1f}x"
            )
        for system, summary in runs.items():
            if summary is None:
                continue
            rate = cell(summary, "msgs_per_s_per_receiver_median", ".1f")
            p50, p99 = (
                cell(summary, "latency_p50_ms", ".0f"),
                cell(summary, "latency_p99_ms", ".0f"),
            )
            print(
                f"| {workload} | {system} | {rate} | {p50} / {p99} "
                f"| {cell(summary, 'delivery_ratio', '.4f')} "
                f"| {cell(summary, 'payload_copies_per_delivered', '.2f')} "
                f"| {cell(summary, 'wire_bytes_per_delivered', '.0f')} "
                f"| {format(summary['cpu_s_per_delivered'] * 1000, '.2f')} "
                f"| {ratio if system == 'episub' else ''} |"
            )


if __name__ == "__main__":
    main()
