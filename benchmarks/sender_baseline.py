"""Many senders against each of the same senders alone, on the same overlay.

    .venv/bin/python benchmarks/sender_baseline.py --nodes 300 --senders 8 --messages 100 \\
        --warmup 50 --seed 1 --jobs 2

Takes the arguments of `episub sim multi-sender` and runs it once, then `steady` once per
sender, each with that sender alone (`--sender NODE`: the seed's other draws, the overlay
among them, stay the same). `steady`'s own sender is one of multi-sender's (the seed's
first draw), so the usual comparison, multi-sender against `steady`, sets the deepest and
slowest of K trees against one tree drawn at random. This sets it against the same K
trees, each built alone: the deliveries of the K runs pooled (p99 over all of them, the
largest LDH, the mean RMR) and, per sender, its figures alone and among the others.
Prints one JSON object. Runs are independent: `--jobs N` runs N at once. `--together
FILE` takes the multi-sender report from FILE (that command's `--json` output, same
arguments) instead of running it.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from episub.proto.events import Deliver
from episub.sim.cli import add_parser, params_from_args
from episub.sim.metrics import COUNTED, Collector
from episub.sim.params import SimParams
from episub.sim.scenarios import ScenarioRun


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _run(params: SimParams) -> tuple[dict[str, Any], list[float]]:
    """The run's report and the latency (s) of every counted delivery."""
    run = ScenarioRun(params)
    collector: Collector = run.sim.metrics
    latencies: list[float] = []
    on_deliver = collector.on_deliver

    def record(node: int, out: Deliver, now: float) -> None:
        message = collector.records.get(out.id)
        if message is not None and message.kind == COUNTED and node != message.publisher:
            latencies.append(now - message.published_at)
        on_deliver(node, out, now)

    collector.on_deliver = record  # type: ignore[method-assign]
    return run.execute(), latencies


def _figures(report: dict[str, Any]) -> dict[str, Any]:
    return {
        "reliability": report["reliability"],
        "rmr": report["rmr"],
        "ldh": report["ldh"],
        "p99_ms": report["latency_p99_ms"],
    }


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1, help="runs at once")
    parser.add_argument("--together", help="multi-sender's --json report, not run again")
    known, rest = parser.parse_known_args(argv)
    sim_parser = argparse.ArgumentParser()
    add_parser(sim_parser.add_subparsers())
    many = params_from_args(sim_parser.parse_args(["sim", "multi-sender", "--quiet", *rest]))
    if known.together is None:
        many_report, _ = _run(many)
    else:
        with open(known.together) as file:
            many_report = json.load(file)
        for name in ("nodes", "seed", "messages", "warmup", "sender_count"):
            if many_report[name] != getattr(many, name):
                raise SystemExit(
                    f"{known.together}: {name} {many_report[name]!r}, not {getattr(many, name)!r}"
                )
    senders: list[int] = many_report["senders"]
    alone = [replace(many, scenario="steady", senders=None, sender=s) for s in senders]
    with ProcessPoolExecutor(max_workers=max(1, known.jobs)) as pool:
        results = list(pool.map(_run, alone))
    pooled = [latency for _, latencies in results for latency in latencies]
    baseline = {
        "p99_ms": round(_p99(pooled) * 1000, 3),
        "ldh": max(report["ldh"] for report, _ in results),
        "rmr": round(sum(report["rmr"] for report, _ in results) / len(results), 6),
        "reliability": min(report["reliability"] for report, _ in results),
    }
    overall = _figures(many_report)
    per_sender = {}
    for sender, (report, _) in zip(senders, results, strict=True):
        if report["senders"] != [sender]:
            raise SystemExit(f"the run for {sender} published from {report['senders']}")
        together = many_report["per_sender"][str(sender)]
        per_sender[str(sender)] = {
            "together": _figures(together),
            "alone": _figures(report),
        }
    return {
        "nodes": many.nodes,
        "seed": many.seed,
        "senders": senders,
        "together": overall,
        "alone_pooled": baseline,
        "p99_ratio": round(overall["p99_ms"] / baseline["p99_ms"], 3),
        "ldh_ratio": round(overall["ldh"] / baseline["ldh"], 3),
        "per_sender": per_sender,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=1, sort_keys=True))
