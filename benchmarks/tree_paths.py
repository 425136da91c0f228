"""How far each publisher's delivery tree is from the fastest paths its overlay offers.

    .venv/bin/python benchmarks/tree_paths.py multi-sender --nodes 300 --senders 8 --seed 1

Takes the arguments of `episub sim` and runs that simulation once. Halfway through the
counted messages it takes every live node's active view; shortest one-way delays over
those links (Dijkstra) are each node's fastest path from each sender. Prints one JSON
object: per sender, the p99 of its counted deliveries and of their fastest paths, the
mean of delivery latency over fastest path, and the share of deliveries slower than 1.2x
their fastest path; then the same over all senders. A tree as fast as its overlay has
ratio 1.0; the gap is what tree rules can still win without touching membership.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from typing import Any

from episub.proto.events import Deliver
from episub.sim.cli import add_parser, params_from_args
from episub.sim.metrics import COUNTED, Collector
from episub.sim.scenarios import TOPIC, ScenarioRun

SLOW = 1.2  # a delivery slower than this times its fastest path counts as slow


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    params = params_from_args(parser.parse_args(["sim", *argv]))
    run = ScenarioRun(params)
    sim = run.sim
    collector: Collector = sim.metrics
    # (publisher, node, latency) of every counted delivery
    deliveries: list[tuple[int, int, float]] = []
    on_deliver = collector.on_deliver

    def record(node: int, out: Deliver, now: float) -> None:
        message = collector.records.get(out.id)
        if message is not None and message.kind == COUNTED and node != message.publisher:
            deliveries.append((message.publisher, node, now - message.published_at))
        on_deliver(node, out, now)

    collector.on_deliver = record  # type: ignore[method-assign]
    views: dict[int, set[int]] = {}

    def snapshot() -> None:
        nodes: Any = sim.nodes
        views.update({n: set(nodes[n].active_view(TOPIC)) for n in run.live()})

    p = params
    start = (p.nodes - 1) / p.effective_join_rate + p.effective_settle + p.warmup * p.interval
    sim.call_at(start + p.messages * p.interval / 2, snapshot)
    report = run.execute()

    def fastest(source: int) -> dict[int, float]:
        dist = {source: 0.0}
        queue = [(0.0, source)]
        while queue:
            d, u = heapq.heappop(queue)
            if d > dist[u]:
                continue
            for v in views.get(u, ()):
                if u in views.get(v, ()) and d + sim.delay(u, v) < dist.get(v, float("inf")):
                    dist[v] = d + sim.delay(u, v)
                    heapq.heappush(queue, (dist[v], v))
        return dist

    per_sender: dict[str, Any] = {}
    every_ratio: list[float] = []
    for sender in sorted({publisher for publisher, _, _ in deliveries}):
        dist = fastest(sender)
        mine = [(node, lat) for publisher, node, lat in deliveries if publisher == sender]
        paths = [dist[node] for node, _ in mine if node in dist]
        ratios = [lat / dist[node] for node, lat in mine if dist.get(node, 0.0) > 0]
        every_ratio += ratios
        per_sender[str(sender)] = {
            "p99_ms": round(_p99([lat for _, lat in mine]) * 1000, 1),
            "fastest_p99_ms": round(_p99(paths) * 1000, 1),
            "ratio_mean": round(sum(ratios) / len(ratios), 3),
            "slow_share": round(sum(r > SLOW for r in ratios) / len(ratios), 3),
        }
    return {
        "reliability": report["reliability"],
        "rmr": report["rmr"],
        "ldh": report["ldh"],
        "latency_p99_ms": report["latency_p99_ms"],
        "ratio_mean": round(sum(every_ratio) / len(every_ratio), 3),
        "slow_share": round(sum(r > SLOW for r in every_ratio) / len(every_ratio), 3),
        "per_sender": per_sender,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=1))
