"""Run the foundation issue's acceptance commands and record their figures.

    .venv/bin/python benchmarks/simulation.py            # all runs (~15 min on 2 cores)
    .venv/bin/python benchmarks/simulation.py --skip-10k # without the 10,000-node run

Each run is the `episub sim ... --json` command shown beside its figures; the JSON of
every run is written to benchmarks/results/simulation.json and a summary is printed.
docs/simulation.md quotes these figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EPISUB = [sys.executable, "-m", "episub.cli"]

RUNS: list[tuple[str, list[str]]] = [
    (name, args.split())
    for name, args in (
        ("steady-1k", "steady --nodes 1000 --messages 100 --warmup 50 --seed 1"),
        ("steady-10k", "steady --nodes 10000 --messages 20 --warmup 10 --seed 1"),
        ("crash-0.5", "crash --nodes 1000 --fraction 0.5 --seed 1"),
        ("crash-0.8", "crash --nodes 1000 --fraction 0.8 --seed 1"),
        ("churn", "churn --nodes 1000 --rate 0.01 --duration 60 --seed 1"),
        ("proximity-2d", "proximity --nodes 1000 --seed 1"),
        ("proximity-zones", "proximity --nodes 1000 --seed 1 --zones 3"),
        ("partition", "partition --nodes 1000 --seed 1"),
        ("multi-sender", "multi-sender --nodes 1000 --seed 1"),
    )
]

KEYS = (
    "reliability",
    "duplicates",
    "rmr",
    "ldh",
    "latency_p50_ms",
    "latency_p99_ms",
    "stretch_mean",
    "cross_zone_copies_per_message",
    "heal_seconds",
    "wall_seconds",
)


def summary(report: dict) -> dict:
    return {key: report.get(key) for key in KEYS if report.get(key) is not None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-10k", action="store_true", help="leave out the 10,000-node run")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/simulation.json")
    args = parser.parse_args()
    results: dict[str, dict] = {}
    for name, argv in RUNS:
        if args.skip_10k and name == "steady-10k":
            continue
        command = ["episub", "sim", *argv, "--json"]
        started = time.perf_counter()
        proc = subprocess.run(
            [*EPISUB, "sim", *argv, "--json", "--quiet"], capture_output=True, text=True, cwd=ROOT
        )
        if proc.returncode != 0:
            print(f"{name}: failed\n{proc.stderr}", file=sys.stderr)
            return 1
        report = json.loads(proc.stdout)
        results[name] = {"command": " ".join(command), "report": report}
        print(f"{name}  ({time.perf_counter() - started:.0f} s)  {' '.join(command)}")
        if "proximity_on" in report:
            for side in ("proximity_on", "proximity_off"):
                print(f"    {side}: {summary(report[side])}")
        else:
            print(f"    {summary(report)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    shown = args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out
    print(f"written: {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
