"""Where the proximity scenario's latency goes: the tree or the overlay under it.

    .venv/bin/python benchmarks/proximity_paths.py --seeds 1 2 3 4 5            # 2-D model
    .venv/bin/python benchmarks/proximity_paths.py --seeds 1 --zones 3 --off    # zones, both

For each seed it runs `episub sim proximity --nodes N --seed S` (proximity on, and off
with --off) and, half-way through the counted messages, takes the overlay as it stands:
every active link with its one-way latency. It prints the achieved delivery p50 beside
the p50 of the shortest paths from the publisher over that overlay (Dijkstra over the
links), over the eager links only, and the mean latency of NEAR links against each
node's 3 nearest nodes. Achieved close to the overlay's shortest paths says the tree is
not the limit (Plumtree's first copies already take the fastest paths); the link choice
is. A diagnostic of the simulator: nothing here is in the core. Deterministic; it
writes nothing.
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
from collections.abc import Callable, Mapping, Sequence

from episub.proto.messages import LinkKind
from episub.sim.cli import add_parser, params_from_args
from episub.sim.params import SimParams
from episub.sim.scenarios import TOPIC, ScenarioRun


def sim_params(nodes: int, seed: int, zones: int | None) -> SimParams:
    """The parameters `episub sim proximity` takes for these arguments (its defaults)."""
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    argv = ["sim", "proximity", "--nodes", str(nodes), "--seed", str(seed)]
    return params_from_args(parser.parse_args(argv + (["--zones", str(zones)] if zones else [])))


def shortest_paths(
    source: int, links: Mapping[int, Sequence[int]], delay: Callable[[int, int], float]
) -> dict[int, float]:
    """Dijkstra from `source` over `links` (node -> neighbours), `delay` per hop."""
    dist = {source: 0.0}
    heap = [(0.0, source)]
    while heap:
        d, node = heapq.heappop(heap)
        if d > dist[node]:
            continue
        for peer in links.get(node, ()):
            nd = d + delay(node, peer)
            if nd < dist.get(peer, float("inf")):
                dist[peer] = nd
                heapq.heappush(heap, (nd, peer))
    return dist


def median_ms(values: list[float]) -> float:
    return round(1000 * statistics.median(values), 1)


def measure(params: SimParams, proximity: bool) -> dict[str, object]:
    run = ScenarioRun(params, proximity=proximity)
    overlay: dict[str, object] = {}
    counted = run.counted

    def look() -> None:
        sim, publisher = run.sim, run.senders[0]
        nodes: dict = sim.nodes  # type: ignore[assignment]
        views = {n: nodes[n].active_view(TOPIC) for n in nodes}
        everyone = list(nodes)
        over = shortest_paths(publisher, {n: list(v) for n, v in views.items()}, sim.delay)
        eager = shortest_paths(
            publisher, {n: nodes[n].eager_peers(TOPIC) for n in nodes}, sim.delay
        )
        near = [
            sim.delay(n, p) for n, v in views.items() for p, k in v.items() if k is LinkKind.NEAR
        ]
        nearest = [
            sim.delay(n, p)
            for n in everyone
            for p in sorted((p for p in everyone if p != n), key=lambda p: sim.delay(n, p))[:3]
        ]
        overlay.update(
            overlay_shortest_p50_ms=median_ms([d for n, d in over.items() if n != publisher]),
            eager_shortest_p50_ms=median_ms([d for n, d in eager.items() if n != publisher]),
            direct_p50_ms=median_ms([sim.delay(publisher, n) for n in everyone if n != publisher]),
            near_link_mean_ms=round(1000 * statistics.mean(near), 2) if near else None,
            nearest_3_mean_ms=round(1000 * statistics.mean(nearest), 2),
        )

    def counted_and_look(start: float) -> float:
        end = counted(start)
        run.sim.call_at(start + params.messages * params.interval / 2, look)
        return end

    run.counted = counted_and_look  # type: ignore[method-assign]
    report = run.execute()
    return {
        "latency_p50_ms": report["latency_p50_ms"],
        "latency_p99_ms": report["latency_p99_ms"],
        "cross_zone_copies_per_message": report.get("cross_zone_copies_per_message"),
        **overlay,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--zones", type=int, default=None, help="zones model (default 2-D)")
    parser.add_argument("--off", action="store_true", help="also run with proximity off")
    args = parser.parse_args()
    for seed in args.seeds:
        params = sim_params(args.nodes, seed, args.zones)
        for proximity in (True, False) if args.off else (True,):
            row = {"seed": seed, "proximity": proximity, **measure(params, proximity)}
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
