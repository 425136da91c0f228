"""`episub inspect --draw FILE.png`: the picture of a live deployment's overlay.

The agent walks the topic's overlay (AgentClient.overlay, episub.crawl) and every node
reached reports its active view; each node is drawn with its address as its label (one
node per process: an executor's agent, the driver's, an `episub node`), links coloured
by the RTT the reporting node measured, and the eager tree of `publisher` highlighted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from episub.viz.overlay import Overlay, OverlayLink, OverlayNode, draw_overlay

__all__ = ["draw_deployment", "overlay_of_walk"]


def _key(peer_id: bytes) -> str:
    return peer_id.decode("ascii", "replace")


def overlay_of_walk(nodes: list[Any]) -> Overlay:
    """An Overlay from AgentClient.overlay()'s nodes (OverlayNode)."""
    out = Overlay()
    for node in nodes:
        suffix = "" if node.answered else " (no answer)"
        out.nodes.append(OverlayNode(key=_key(node.node_id), label=node.address + suffix))
        for n in node.neighbors:
            out.links.append(
                OverlayLink(
                    a=_key(node.node_id),
                    b=_key(n.peer_id),
                    kind=n.kind,
                    eager=n.role == "eager",
                    rtt_ms=n.rtt_ms,
                )
            )
    return out


def draw_deployment(
    nodes: list[Any], path: str | Path, *, publisher: str | None, topic: str
) -> dict[str, Any]:
    """Draw the walk's nodes; `publisher` is an address or peer id (default: the first
    node, the one asked)."""
    overlay = overlay_of_walk(nodes)
    chosen = _key(nodes[0].node_id)
    if publisher is not None:
        matches = [n for n in nodes if publisher in (n.address, _key(n.node_id))]
        if not matches:
            raise ValueError(f"no node {publisher!r} in the overlay of {topic!r}")
        chosen = _key(matches[0].node_id)
    answered = sum(1 for n in nodes if n.answered)
    title = f"topic {topic!r}: {len(nodes)} nodes ({answered} answered)"
    return draw_overlay(overlay, path, publisher=chosen, title=title)
