"""What a run keeps beyond its report, for pictures: the overlay at the end, and series.

`run(..., extras=True)` adds both to the report, under "overlay" and "series"; the `--draw`
and `--plot` options of `episub sim` use them (episub/viz) and leave them out of what they
print. Plain JSON-ready values, so a run in another process sends them back pickled.

- overlay: every live node (key = its number; group = its zone on the zones model),
  every active link as its owner sees it (kind, eager or lazy, the RTT the owner measured),
  the first sender as the publisher, and the latency model's points on the 2-D model.
- series: per counted message its RMR and LDH (metrics.py's definitions, one message at
  a time), every counted delivery's latency, the live nodes' active and passive view
  sizes, and per probe the share of live nodes it reached within the probe deadline.
"""

from __future__ import annotations

from typing import Any

from episub.proto.messages import LinkKind

__all__ = ["overlay_of", "series_of"]


def overlay_of(run: Any, topic: str) -> dict[str, Any]:
    """The live overlay of `run` (a scenarios.ScenarioRun) on `topic`."""
    latency = run.latency
    nodes: Any = run.sim.nodes
    live = run.live()
    out_nodes = []
    links = []
    for node in live:
        zone = latency.zone_of(node)
        out_nodes.append(
            {
                "key": str(node),
                "label": str(node),
                "group": None if zone is None else f"zone {zone}",
            }
        )
        state = nodes[node]
        eager = set(state.eager_peers(topic))
        for peer, kind in state.active_view(topic).items():
            rtt = state.rtt(peer)
            links.append(
                {
                    "a": str(node),
                    "b": str(peer),
                    "kind": "near" if kind is LinkKind.NEAR else "rand",
                    "eager": peer in eager,
                    "rtt_ms": None if rtt is None else round(rtt * 1000.0, 3),
                }
            )
    positions = None
    if hasattr(latency, "point"):  # the 2-D model: draw nodes where the network puts them
        positions = {str(node): tuple(latency.point(node)) for node in live}
    senders = run.senders
    return {
        "nodes": out_nodes,
        "links": links,
        "positions": positions,
        "publisher": str(senders[0]) if senders and senders[0] in nodes else None,
    }


def series_of(run: Any, topic: str) -> dict[str, Any]:
    c = run.sim.metrics
    per_message = []
    for record in c.counted:
        rmr = None
        if record.delivered > 0:
            rmr = round(c.gossip_sends.get(record.id, 0) / record.delivered - 1.0, 6)
        per_message.append({"index": record.index, "rmr": rmr, "ldh": record.max_hops})
    live = run.live()
    nodes: Any = run.sim.nodes
    since = run.heal_since
    probes = [
        {
            "at": round(record.published_at - (since or 0.0), 6),
            "reached": round(record.on_time / max(1, len(live) - 1), 6),
        }
        for record in c.probes
    ]
    return {
        "per_message": per_message,
        "latencies_ms": [round(x * 1000.0, 3) for x in c.latencies],
        "active_sizes": [len(nodes[n].active_view(topic)) for n in live],
        "passive_sizes": [len(nodes[n].passive_view(topic)) for n in live],
        "probes": probes,
    }
