"""Walk a topic's overlay from one node: every node reports its active view (GETVIEW).

    views = await crawl(node, "prices", max_nodes=256, timeout=5.0)

Breadth-first from `node`: its own view first, then every peer named in a view gathered
so far is asked for its own (`Node.view_of`), at most `parallel` at a time. Bounded
three ways: at most `max_nodes` nodes are asked, each answer is one VIEW message
(<= 256 links), and the whole walk ends after `timeout` seconds; a node that did not
answer in time is listed with `answered=False` and no links. What is returned is a
picture taken over a few round trips, not an instant: views that change during the walk
may disagree at their edges.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from episub.net.peer_id import PeerIdError, parse_peer_id
from episub.node import VIEW_TIMEOUT, NeighborLink, Node
from episub.proto.messages import LinkKind, View
from episub.records import CRAWL_TIMEOUT

__all__ = ["CRAWL_MAX_NODES", "CRAWL_PARALLEL", "CRAWL_TIMEOUT", "NodeView", "crawl"]

CRAWL_MAX_NODES = 256  # guess: a Spark cluster's executors, with room; the agent caps it
CRAWL_PARALLEL = 16  # guess: dials at once; well under MAX_PENDING_HANDSHAKES (64)


@dataclass(frozen=True, slots=True)
class NodeView:
    peer_id: bytes
    address: str
    answered: bool
    neighbors: list[NeighborLink]
    passive_count: int


def address_of(peer_id: bytes) -> str:
    try:
        return str(parse_peer_id(peer_id))
    except PeerIdError:
        return "?"


def _node_view(peer_id: bytes, view: View | None) -> NodeView:
    if view is None:
        return NodeView(peer_id, address_of(peer_id), False, [], 0)
    neighbors = [
        NeighborLink(
            peer_id=e.peer,  # type: ignore[arg-type]
            address=address_of(e.peer),  # type: ignore[arg-type]
            kind="near" if e.kind is LinkKind.NEAR else "rand",
            role="eager" if e.eager else "lazy",
            rtt_ms=None if e.rtt is None else e.rtt * 1000.0,
        )
        for e in view.entries
        if isinstance(e.peer, bytes)
    ]
    return NodeView(peer_id, address_of(peer_id), True, neighbors, view.passive_count)


async def crawl(
    node: Node,
    topic: str,
    *,
    max_nodes: int = CRAWL_MAX_NODES,
    timeout: float = CRAWL_TIMEOUT,
    parallel: int = CRAWL_PARALLEL,
    ask_timeout: float = VIEW_TIMEOUT,
) -> list[NodeView]:
    """The views of `topic`'s nodes reachable from `node`, `node` first, then in the order
    they were found."""
    if max_nodes < 1 or parallel < 1:
        raise ValueError(f"max_nodes and parallel must be >= 1, not {max_nodes}, {parallel}")
    found: dict[bytes, NodeView | None] = {node.id: None}  # insertion order: discovery
    limiter = trio.CapacityLimiter(parallel)

    async def visit(peer_id: bytes, nursery: trio.Nursery) -> None:
        async with limiter:
            view = await node.view_of(topic, peer_id, timeout=ask_timeout)
        result = found[peer_id] = _node_view(peer_id, view)
        for neighbor in result.neighbors:
            if neighbor.peer_id not in found and len(found) < max_nodes:
                found[neighbor.peer_id] = None
                nursery.start_soon(visit, neighbor.peer_id, nursery)

    with trio.move_on_after(timeout):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(visit, node.id, nursery)
    return [
        view if view is not None else NodeView(peer, address_of(peer), False, [], 0)
        for peer, view in found.items()
    ]
