"""What a simulation measures, and how the numbers of the report are computed.

The collector sees every output of every node, so its hot-path methods only increment
dicts and flip bytes; everything else is computed once, in `summarize`, at the end.

Which message a `Published`/`Deliver` belongs to is read from its payload, which the
scenario writes as a one-letter kind and an index (`b"c17"`: counted message 17):
`w` warm-up (builds the Plumtree tree, not measured), `c` counted, `p` probe (heal time).

Definitions (the paper's metrics, made precise where the brief left room):

- reliability: delivered / expected over (counted message, node) pairs. A pair is
  expected when the node is not the publisher, had joined before the publish and did
  not leave or crash before the message's lifetime ended (publish + `lifetime`).
  Joined = its first link up at both ends (both reported NeighborUp): a node whose JOIN
  walk is still under way, or whose first link its peer has not heard accepted yet, is
  not held to a message it could not yet receive (a message the peer got before then
  was forwarded without it). Live nodes that never got a neighbour are
  reported apart as `never_joined`.
- rmr: per counted message, gossip_payload_sends / (holders - 1) - 1, with holders =
  distinct delivering nodes + the publisher and payload sends = every `Send` of a
  `Gossip` with that id (eager pushes and GRAFT/PULL answers); mean over messages
  that reached at least one node.
- ldh: the largest `hops` of any Deliver of a counted message.
- per_sender (runs with several senders): reliability, rmr, ldh and latency percentiles
  as above over each sender's own counted messages, keyed by the sender's node number.
- latency: deliver time - publish time over every Deliver of a counted message;
  percentiles by nearest rank. stretch: the same latency over the direct one-way
  delay publisher->node, averaged over those deliveries.
- symmetry_violations: live pairs (a, b) with b in A(a) but a not in A(b) at the end.
  A NEIGHBOR or DISCONNECT in flight makes such a pair for a round trip, so the run
  goes on `SYMMETRY_RECHECK` seconds after the drain and `symmetry_violations_persistent`
  counts the pairs that were asymmetric at both instants: those are stuck.
- heal_seconds: probes are published every `probe_interval` after a crash or heal; a
  probe "reaches" when every live node but its publisher delivered it within
  `probe_deadline` of its publish. heal = publish time of the first probe such that it
  and every later probe reached, minus the time of the crash (or heal); null if the
  last probe did not reach.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Collection, Iterable, Mapping

from episub.proto.events import (
    ClosePeer,
    DataLost,
    Deliver,
    NeighborDown,
    NeighborUp,
    PeerMisbehaved,
    Published,
)
from episub.proto.messages import Gossip, Graft, Heads, IHave, Pull

COUNTED = "c"
WARMUP = "w"
PROBE = "p"

# Message classes whose traffic means the broadcast layer is still at work; the drain
# phase stops once none of them has been sent for a while.
BROADCAST_CLASSES = (Gossip, IHave, Graft, Pull, Heads)

_OUTPUT_NAMES = {
    NeighborUp: "neighbor_up",
    NeighborDown: "neighbor_down",
    ClosePeer: "close_peer",
    DataLost: "data_lost",
    PeerMisbehaved: "peer_misbehaved",
}


def payload_for(kind: str, index: int) -> bytes:
    """The payload a scenario publishes: it names the message for the collector."""
    return f"{kind}{index}".encode()


class MessageRecord:
    """One published message: who, when, and which nodes delivered it (a byte per id)."""

    __slots__ = (
        "delivered",
        "got",
        "id",
        "index",
        "kind",
        "max_hops",
        "on_time",
        "published_at",
        "publisher",
    )

    def __init__(
        self, message_id: bytes, kind: str, index: int, publisher: int, at: float, size: int
    ) -> None:
        self.id = message_id
        self.kind = kind
        self.index = index
        self.publisher = publisher
        self.published_at = at
        self.got = bytearray(size)
        self.delivered = 0  # distinct nodes, publisher excluded
        self.on_time = 0  # of those, within the probe deadline
        self.max_hops = 0  # the message's own last delivery hop (its LDH)


class Collector:
    """Counts what the nodes output; `Simulator.run` calls it for every output it sees."""

    def __init__(
        self,
        *,
        direct: Callable[[int, int], float],
        zone_of: Callable[[int], int | None] | None = None,
        probe_deadline: float = 2.0,
    ) -> None:
        self._direct = direct  # publisher->node one-way delay, for stretch
        self.zone_of = zone_of  # the engine counts cross-zone Gossip sends when set
        self.probe_deadline = probe_deadline
        self.capacity = 0  # bitmap size for new records: the engine keeps it at max id + 1
        self.records: dict[bytes, MessageRecord] = {}
        self.counted: list[MessageRecord] = []
        self.probes: list[MessageRecord] = []
        # Filled directly by the engine's hot loop:
        self.sent: dict[type, int] = {}  # message class -> Send outputs
        self.gossip_sends: dict[bytes, int] = {}  # message id -> Gossip sends
        self.cross_zone: dict[bytes, int] = {}  # message id -> Gossip sends across zones
        self.dropped_loss = 0
        self.dropped_fault = 0  # sends dropped by fault injection (kind drops, one-way cut)
        self.failed_sends = 0  # to a dead node or across the cut
        self.connection_lost = 0  # ConnectionLost inputs the engine generated
        # Filled by the methods below:
        self.outputs: dict[type, int] = {}
        self.data_lost_seqs = 0
        self.first_up: dict[int, float] = {}  # node -> when its first link was up at both ends
        self._half_up: set[tuple[int, int]] = set()  # (node, peer): node reported NeighborUp
        self.duplicates = 0
        self.self_deliveries = 0
        self.unknown_deliveries = 0
        self.latencies = array("d")
        self.latencies_by_publisher: dict[int, array[float]] = {}  # counted, per sender
        self.stretch_sum = 0.0
        self.ldh = 0

    def on_published(self, node: int, out: Published, now: float) -> None:
        payload = out.envelope.payload
        kind = payload[:1].decode()
        record = MessageRecord(out.id, kind, int(payload[1:]), node, now, self.capacity)
        self.records[out.id] = record
        if kind == COUNTED:
            self.counted.append(record)
        elif kind == PROBE:
            self.probes.append(record)

    def on_deliver(self, node: int, out: Deliver, now: float) -> None:
        record = self.records.get(out.id)
        if record is None:
            self.unknown_deliveries += 1
            return
        if node == record.publisher:
            self.self_deliveries += 1
            return
        got = record.got
        if node >= len(got):
            got.extend(bytes(node + 1 - len(got)))
        if got[node]:
            self.duplicates += 1
            return
        got[node] = 1
        record.delivered += 1
        latency = now - record.published_at
        if latency <= self.probe_deadline:
            record.on_time += 1
        if record.kind == COUNTED:
            self.latencies.append(latency)
            by_publisher = self.latencies_by_publisher.get(record.publisher)
            if by_publisher is None:
                by_publisher = self.latencies_by_publisher[record.publisher] = array("d")
            by_publisher.append(latency)
            self.stretch_sum += latency / self._direct(record.publisher, node)
            if out.hops > record.max_hops:
                record.max_hops = out.hops
            if out.hops > self.ldh:
                self.ldh = out.hops

    def on_other(self, node: int, out: object, now: float) -> None:
        cls = out.__class__
        self.outputs[cls] = self.outputs.get(cls, 0) + 1
        if cls is NeighborUp:
            peer = out.peer  # type: ignore[attr-defined]
            self._half_up.add((node, peer))
            if (peer, node) in self._half_up:
                # Both ends know the link: from now on the peer forwards to the node.
                first_up = self.first_up
                if node not in first_up:
                    first_up[node] = now
                if peer not in first_up:
                    first_up[peer] = now
        elif cls is NeighborDown:
            self._half_up.discard((node, out.peer))  # type: ignore[attr-defined]
        elif cls is DataLost:
            self.data_lost_seqs += out.last_seq - out.first_seq + 1  # type: ignore[attr-defined]

    def broadcast_sends(self) -> int:
        """Broadcast-layer messages sent so far (the drain phase watches this stand still)."""
        sent = self.sent
        return sum(sent.get(cls, 0) for cls in BROADCAST_CLASSES)

    def counted_complete(self, live: list[int]) -> bool:
        """Has every live node but the publisher delivered every counted message?"""
        need = len(live) - 1
        for record in self.counted:
            if record.delivered < need:
                return False
        for record in self.counted:
            got, size, publisher = record.got, len(record.got), record.publisher
            for node in live:
                if node != publisher and (node >= size or not got[node]):
                    return False
        return True


def _percentile(ordered: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not ordered:
        return None
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def heal_seconds(probes: list[MessageRecord], live_count: int, since: float) -> float | None:
    """Publish time of the first probe from which on every probe reached, minus `since`."""
    first = None
    for record in probes:
        if record.on_time >= live_count - 1:
            if first is None:
                first = record
        else:
            first = None
    return None if first is None else round(first.published_at - since, 6)


def asymmetric_pairs(
    live: list[int], active_views: Mapping[int, Iterable[int]]
) -> set[tuple[int, int]]:
    """Live pairs (a, b) with b in A(a) but a not in A(b)."""
    live_set = set(live)
    views = {node: set(peers) for node, peers in active_views.items()}
    pairs = set()
    for node in live:
        for peer in views.get(node, ()):
            if peer in live_set and node not in views.get(peer, ()):
                pairs.add((node, peer))
    return pairs


def summarize(
    collector: Collector,
    *,
    live: list[int],
    departed: Mapping[int, float],
    lifetime: float,
    active_views: Mapping[int, Collection[int]],
    passive_sizes: Mapping[int, int],
    heal_since: float | None,
    earlier_asymmetric: Iterable[tuple[int, int]] = (),
) -> dict[str, object]:
    """The report's numbers (see the module docstring for the definitions)."""
    c = collector
    expected = delivered = 0
    # publisher -> [expected, delivered, rmr sum, rmr count, ldh]
    senders: dict[int, list[float]] = {}
    joined = list(c.first_up.items())
    for record in c.counted:
        mine = senders.setdefault(record.publisher, [0, 0, 0.0, 0, 0])
        mine[4] = max(mine[4], record.max_hops)
        was = expected, delivered
        start, end = record.published_at, record.published_at + lifetime
        got, size, publisher = record.got, len(record.got), record.publisher
        for node, up in joined:
            if node == publisher or up >= start:
                continue
            gone = departed.get(node)
            if gone is not None and gone < end:
                continue
            expected += 1
            if node < size and got[node]:
                delivered += 1
        mine[0] += expected - was[0]
        mine[1] += delivered - was[1]

    rmrs = []
    for record in c.counted:
        if record.delivered > 0:
            rmrs.append(c.gossip_sends.get(record.id, 0) / record.delivered - 1.0)
            mine = senders[record.publisher]
            mine[2] += rmrs[-1]
            mine[3] += 1

    ordered = sorted(c.latencies)
    n_counted = len(c.counted)
    cross_zone = None
    if c.zone_of is not None:
        total = sum(c.cross_zone.get(record.id, 0) for record in c.counted)
        cross_zone = _round(total / n_counted) if n_counted else None

    hist: dict[int, int] = {}
    for node in live:
        size = len(active_views.get(node, ()))
        hist[size] = hist.get(size, 0) + 1
    asymmetric = asymmetric_pairs(live, active_views)
    passive = [passive_sizes.get(node, 0) for node in live]

    outputs = {name: c.outputs.get(cls, 0) for cls, name in _OUTPUT_NAMES.items()}
    per_sender = {}
    if len(senders) > 1:
        for publisher in sorted(senders):
            exp, got_, rmr_sum, rmr_n, ldh = senders[publisher]
            mine_ordered = sorted(c.latencies_by_publisher.get(publisher, ()))
            per_sender[str(publisher)] = {
                "reliability": _round(got_ / exp) if exp else None,
                "rmr": _round(rmr_sum / rmr_n) if rmr_n else None,
                "ldh": int(ldh),
                "latency_p50_ms": _ms(_percentile(mine_ordered, 0.50)),
                "latency_p99_ms": _ms(_percentile(mine_ordered, 0.99)),
            }
    return {
        "reliability": _round(delivered / expected) if expected else None,
        "expected": expected,
        "delivered": delivered,
        "missed": expected - delivered,
        "duplicates": c.duplicates,
        "rmr": _round(sum(rmrs) / len(rmrs)) if rmrs else None,
        "ldh": c.ldh,
        "latency_p50_ms": _ms(_percentile(ordered, 0.50)),
        "latency_p99_ms": _ms(_percentile(ordered, 0.99)),
        "latency_mean_ms": _ms(sum(ordered) / len(ordered)) if ordered else None,
        **({"per_sender": per_sender} if per_sender else {}),
        "stretch_mean": _round(c.stretch_sum / len(ordered)) if ordered else None,
        "cross_zone_copies_per_message": cross_zone,
        "active_view_hist": {str(size): hist[size] for size in sorted(hist)},
        "passive_view_mean": _round(sum(passive) / len(passive)) if passive else None,
        "symmetry_violations": len(asymmetric),
        "symmetry_violations_persistent": len(asymmetric & set(earlier_asymmetric)),
        "heal_seconds": (
            heal_seconds(c.probes, len(live), heal_since) if heal_since is not None else None
        ),
        "probes": len(c.probes),
        "probes_reached": sum(1 for record in c.probes if record.on_time >= len(live) - 1),
        "live_nodes": len(live),
        "never_joined": sum(1 for node in live if node not in c.first_up),
        "sent_by_kind": {
            cls.__name__: count
            for cls, count in sorted(c.sent.items(), key=lambda item: item[0].__name__)
        },
        "messages_sent": sum(c.sent.values()),
        "dropped_by_loss": c.dropped_loss,
        "dropped_by_faults": c.dropped_fault,
        "failed_sends": c.failed_sends,
        "connection_lost": c.connection_lost,
        "data_lost_seqs": c.data_lost_seqs,
        "self_deliveries": c.self_deliveries,
        "unknown_deliveries": c.unknown_deliveries,
        **outputs,
    }
