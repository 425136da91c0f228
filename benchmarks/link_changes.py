"""How often the overlay's links change in each phase of a simulation, and why.

    .venv/bin/python benchmarks/link_changes.py multi-sender --nodes 300 --senders 8 --seed 1

Takes the arguments of `episub sim` and runs that simulation once. Every link that comes
up or goes down touches every publisher stream's delivery tree at both ends, so the
changes during the counted messages are where redundant copies and long paths come from
(docs/protocol.md, delivery trees). Prints one JSON object: the run's figures, then per
phase (join, settle, warm-up, counted) its length in simulated seconds, the links made
(NEAR and RAND, each link once), the links ended, and the membership counters that say
why: optimisation swaps (a NEAR link made to replace a farther one), relabels, near links
adopted and links dropped by stabilisation.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from episub.proto.events import NeighborDown, NeighborUp
from episub.sim.cli import add_parser, params_from_args
from episub.sim.metrics import Collector
from episub.sim.scenarios import ScenarioRun

WHY = ("optimize_swaps", "relabels", "near_adopted", "stabilize_drops")


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    params = params_from_args(parser.parse_args(["sim", *argv]))
    if params.scenario not in ("steady", "multi-sender"):
        raise SystemExit("link_changes.py follows the phases of steady and multi-sender only")
    run = ScenarioRun(params)
    sim = run.sim
    collector: Collector = sim.metrics
    p = params
    joined = (p.nodes - 1) / p.effective_join_rate
    settled = joined + p.effective_settle
    warmed = settled + p.warmup * p.interval
    counted = warmed + p.messages * p.interval
    bounds = (
        ("join", 0.0, joined),
        ("settle", joined, settled),
        ("warm-up", settled, warmed),
        ("counted", warmed, counted),
    )
    phases: dict[str, dict[str, Any]] = {
        name: {"seconds": round(end - start, 3), "near_up": 0, "rand_up": 0, "down": 0}
        for name, start, end in bounds
    }

    def phase_at(now: float) -> str | None:
        return next((name for name, start, end in bounds if start <= now < end), None)

    on_other = collector.on_other

    def record(node: int, out: object, now: float) -> None:
        # A link is counted once, at the end with the lower id (both ends report it).
        name = phase_at(now)
        if (
            name is not None and isinstance(out, NeighborUp | NeighborDown) and node < out.peer  # type: ignore[operator]  # the simulator's ids are ints
        ):
            if isinstance(out, NeighborDown):
                phases[name]["down"] += 1
            else:
                phases[name]["near_up" if out.kind.name == "NEAR" else "rand_up"] += 1
        on_other(node, out, now)

    collector.on_other = record  # type: ignore[method-assign]

    def totals() -> dict[str, int]:
        summed = dict.fromkeys(WHY, 0)
        for state in sim.nodes.values():
            stats = state.stats()  # type: ignore[attr-defined]
            for key in WHY:
                summed[key] += stats.get(key, 0)
        return summed

    taken: dict[float, dict[str, int]] = {}
    for at in sorted({end for _, _, end in bounds}):
        sim.call_at(at, lambda at=at: taken.__setitem__(at, totals()))  # type: ignore[misc]
    report = run.execute()
    before = dict.fromkeys(WHY, 0)
    for name, _, end in bounds:
        after = taken.get(end, before)
        phases[name].update({key: after[key] - before[key] for key in WHY})
        before = after
    return {
        "reliability": report["reliability"],
        "rmr": report["rmr"],
        "ldh": report["ldh"],
        "latency_p50_ms": report["latency_p50_ms"],
        "latency_p99_ms": report["latency_p99_ms"],
        "phases": phases,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=1))
