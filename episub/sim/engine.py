"""The discrete-event engine: many sans-IO nodes on one simulated clock, in one process.

The model is iroh-gossip's proto/sim.rs. A heap holds `(time, seq, node, event)` tuples;
`seq` is a global counter, so events due at the same time run in the order they were
queued, and a later-queued disconnect always follows the messages queued before it.
`node >= 0` means "give `event` to that node's `handle`"; `node == ACTION` means
`event` is a zero-argument callable of the scenario (crash, partition, a phase step).

The engine carries out each node's outputs:

- `Send(peer, topic, msg)` becomes `Received(sender, topic, msg)` at `peer` after the
  link's one-way delay (latency model + per-hop processing cost). A send to a dead peer
  or across a partition is dropped and the sender gets `ConnectionLost(peer)` after the
  round trip (one per pair until it has arrived, like one failed dial). With `loss > 0`
  a send is dropped silently with that probability. Fault injection (episub.sim.faults)
  drops or delays chosen message classes (`drop`, `delay`) and may cut one direction of
  the network silently (`one_way`): those drops tell nobody, like `loss`.
- `ScheduleTimer(delay, token)` becomes `TimerFired(token)` after `delay`.
- Everything else goes to the metrics collector; `ClosePeer` also forgets the connection.

Connections: a pair is connected once either end sends to the other and stays so until
a `ClosePeer` from either end (silently, as in iroh's simulator) or a failure. A crash
or removal gives every connected live peer `ConnectionLost` after one one-way delay (the
OS closes the sockets); a partition gives it to both ends of every pair across the cut.

Speed matters (10,000 nodes in minutes): the loop keeps everything in locals, creates no
objects beyond the input events the nodes need, and does no logging.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Mapping
from heapq import heappop, heappush
from typing import Any, Protocol

from episub.proto.events import (
    ClosePeer,
    ConnectionLost,
    Deliver,
    InEvent,
    Published,
    Received,
    ScheduleTimer,
    Send,
    TimerFired,
)
from episub.proto.messages import Gossip
from episub.sim.latency import LatencyModel
from episub.sim.metrics import Collector
from episub.sim.seeds import STREAM_FAULT, STREAM_LOSS, STREAM_NODE, derive

ACTION = -1  # the `node` of a heap entry whose event is a scenario callable


class SimNode(Protocol):
    """What the engine needs of a node: the core's one way in (NodeState fits)."""

    def handle(self, event: InEvent, now: float) -> list[Any]: ...


NodeFactory = Callable[[int, random.Random], SimNode]


class SimulationError(RuntimeError):
    """A node raised while handling an event; the message says which, when and what."""


class Simulator:
    def __init__(
        self,
        *,
        latency: LatencyModel,
        seed: int,
        node_factory: NodeFactory,
        loss: float = 0.0,
        hop_cost: float = 0.0,
        probe_deadline: float = 2.0,
        drop: Mapping[type, float] | None = None,
        delay: Mapping[type, float] | None = None,
    ) -> None:
        if not 0.0 <= loss < 1.0:
            raise ValueError(f"loss must be in [0, 1), not {loss!r}")
        if hop_cost < 0:
            raise ValueError(f"hop_cost must be >= 0 seconds, not {hop_cost!r}")
        for name, table, high in (("drop", drop, 1.0), ("delay", delay, math.inf)):
            for cls, value in (table or {}).items():
                if not 0.0 <= value <= high:
                    raise ValueError(f"{name} of {cls.__name__} out of range: {value!r}")
        self.latency = latency
        self.seed = seed
        self._drop = dict(drop or {})  # message class -> probability a send is dropped
        self._delay = dict(delay or {})  # message class -> seconds added to its delay
        self._one_way: bytearray | None = None  # side 1 cannot send to side 0 while set
        self._fault_rng = random.Random(derive(seed, STREAM_FAULT))
        self.loss = loss
        self.hop_cost = hop_cost
        self._factory = node_factory
        self.now = 0.0
        self.events = 0  # inputs handed to nodes
        self.nodes: dict[int, SimNode] = {}  # live nodes only, in order of creation
        self.departed: dict[int, float] = {}  # node -> when it crashed or left
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        # node -> {peer: one-way delay} of its connections; dicts keep a deterministic order
        self._conns: dict[int, dict[int, float]] = {}
        self._delays: dict[int, float] = {}  # (lo << 32 | hi) -> one-way delay, a cache
        self._failing: dict[tuple[int, int], float] = {}  # pending failed-dial notices
        self._cut: bytearray | None = None  # side of each node while partitioned
        self._loss_rng = random.Random(derive(seed, STREAM_LOSS))
        zone_of = latency.zone_of if latency.has_zones else None
        self.metrics = Collector(direct=self.delay, zone_of=zone_of, probe_deadline=probe_deadline)

    # -- the network ---------------------------------------------------------------------

    def delay(self, a: int, b: int) -> float:
        """One-way delay of a message a->b: the link's latency plus the hop cost."""
        key = (a << 32) | b if a < b else (b << 32) | a
        d = self._delays.get(key)
        if d is None:
            d = self.latency.one_way(a, b) + self.hop_cost
            self._delays[key] = d
        return d

    def connected(self, a: int, b: int) -> bool:
        return b in self._conns.get(a, ())

    # -- what scenarios do -----------------------------------------------------------------

    def add_node(self, node: int) -> SimNode:
        """Create a live node; its RNG is derived from the seed and its id."""
        if node in self.nodes or node in self.departed:
            raise ValueError(f"node id {node} was already used")
        if not 0 <= node < 1 << 32:
            raise ValueError(f"node id must be in 0..2**32-1, not {node!r}")
        state = self._factory(node, random.Random(derive(self.seed, STREAM_NODE, node)))
        self.nodes[node] = state
        self._conns[node] = {}
        if node >= self.metrics.capacity:
            self.metrics.capacity = node + 1
        return state

    def input(self, node: int, event: InEvent, at: float | None = None) -> None:
        """Queue `event` for `node` at time `at` (default: now)."""
        t = self.now if at is None else at
        if t < self.now:
            raise ValueError(f"cannot queue an event in the past ({t} < {self.now})")
        heappush(self._heap, (t, next(self._seq), node, event))

    def call_at(self, at: float, action: Callable[[], None]) -> None:
        """Run `action()` at simulated time `at` (after what is already queued for then)."""
        if at < self.now:
            raise ValueError(f"cannot schedule an action in the past ({at} < {self.now})")
        heappush(self._heap, (at, next(self._seq), ACTION, action))

    def crash(self, node: int) -> None:
        """Kill `node` now: it handles nothing more; its connected peers notice after one
        one-way delay. Also used to remove a node that left gracefully."""
        if self.nodes.pop(node, None) is None:
            return
        self.departed.setdefault(node, self.now)
        peers = self._conns.pop(node, {})
        for peer in sorted(peers):
            self._conns[peer].pop(node, None)
            if peer in self.nodes:
                self._notify_lost(peer, node, self.now + self.delay(node, peer))

    def partition(self, sides: bytearray) -> None:
        """Cut the network: nodes whose `sides[node]` differ cannot reach each other."""
        self._cut = sides
        for a in sorted(self._conns):
            for b in sorted(self._conns[a]):
                if a < b and sides[a] != sides[b]:
                    del self._conns[a][b]
                    del self._conns[b][a]
                    at = self.now + self.delay(a, b)
                    self._notify_lost(a, b, at)
                    self._notify_lost(b, a, at)

    def heal(self) -> None:
        """End the partition: every pair may connect again."""
        self._cut = None

    def cut_one_way(self, sides: bytearray | None) -> None:
        """From now on nodes with `sides[node]` 1 cannot send to nodes with 0 (None: end
        it). Silent: the sends vanish, no connection is lost, in-flight messages arrive."""
        self._one_way = sides

    def _notify_lost(self, node: int, peer: int, at: float) -> None:
        self.metrics.connection_lost += 1
        heappush(self._heap, (at, next(self._seq), node, ConnectionLost(peer)))

    # -- the loop ----------------------------------------------------------------------------

    def run(self, until: float) -> None:
        """Process every event due at or before `until`, then set the clock to `until`."""
        heap = self._heap
        pop, push, seq = heappop, heappush, self._seq
        nodes_get = self.nodes.get
        conns = self._conns
        delays_get = self._delays.get
        delay = self.delay
        failing = self._failing
        failing_get = failing.get
        loss = self.loss
        loss_random = self._loss_rng.random
        metrics = self.metrics
        sent = metrics.sent
        sent_get = sent.get
        gossip_sends = metrics.gossip_sends
        gossip_get = gossip_sends.get
        cross_zone = metrics.cross_zone
        zone_of = metrics.zone_of
        on_deliver = metrics.on_deliver
        on_published = metrics.on_published
        on_other = metrics.on_other
        cut = self._cut
        drop_get = self._drop.get
        delay_get = self._delay.get
        fault_random = self._fault_rng.random
        one_way = self._one_way
        faulty = bool(self._drop or self._delay or one_way is not None)
        events = 0
        dropped = failed = faulted = 0
        try:
            while heap:
                item = pop(heap)
                t, _, node, ev = item
                if t > until:
                    push(heap, item)
                    break
                if node < 0:
                    self.now = t
                    ev()
                    cut = self._cut
                    one_way = self._one_way
                    faulty = bool(self._drop or self._delay or one_way is not None)
                    continue
                state = nodes_get(node)
                if state is None:
                    continue  # dead: its timers and in-flight messages vanish
                if cut is not None and ev.__class__ is Received and cut[ev.peer] != cut[node]:  # type: ignore[call-overload]  # a simulated peer is an int
                    continue  # was in flight when the cut came
                events += 1
                try:
                    outs = state.handle(ev, t)
                except Exception as exc:
                    raise SimulationError(
                        f"node {node} failed at t={t:.6f} handling {ev!r}: {exc!r}"
                    ) from exc
                mine = conns[node]
                for out in outs:
                    cls = out.__class__
                    if cls is Send:
                        peer = out.peer
                        msg = out.message
                        mcls = msg.__class__
                        sent[mcls] = sent_get(mcls, 0) + 1
                        if mcls is Gossip:
                            mid = msg.id
                            gossip_sends[mid] = gossip_get(mid, 0) + 1
                            if zone_of is not None and zone_of(node) != zone_of(peer):
                                cross_zone[mid] = cross_zone.get(mid, 0) + 1
                        # Connected implies alive and on our side of any cut, and the
                        # connection remembers the link's delay: one lookup in the
                        # common case.
                        d = mine.get(peer)
                        if d is None:
                            d = delays_get(
                                (node << 32) | peer if node < peer else (peer << 32) | node
                            )
                            if d is None:
                                d = delay(node, peer)
                            if nodes_get(peer) is None or (
                                cut is not None and cut[node] != cut[peer]
                            ):
                                failed += 1
                                key = (node, peer)
                                if failing_get(key, -1.0) < t:
                                    failing[key] = t + 2 * d
                                    metrics.connection_lost += 1
                                    push(heap, (t + 2 * d, next(seq), node, ConnectionLost(peer)))
                                continue
                            mine[peer] = d
                            conns[peer][node] = d
                        if loss and loss_random() < loss:
                            dropped += 1
                            continue
                        if faulty:
                            if one_way is not None and one_way[node] and not one_way[peer]:
                                faulted += 1
                                continue
                            p = drop_get(mcls)
                            if p is not None and (p >= 1.0 or fault_random() < p):
                                faulted += 1
                                continue
                            d += delay_get(mcls, 0.0)
                        push(heap, (t + d, next(seq), peer, Received(node, out.topic, msg)))
                    elif cls is ScheduleTimer:
                        push(heap, (t + out.delay, next(seq), node, TimerFired(out.token)))
                    elif cls is Deliver:
                        on_deliver(node, out, t)
                    elif cls is Published:
                        on_published(node, out, t)
                    else:
                        if cls is ClosePeer:
                            peer = out.peer
                            if peer in mine:
                                del mine[peer]
                                del conns[peer][node]
                        on_other(node, out, t)
        finally:
            self.events += events
            metrics.dropped_loss += dropped
            metrics.dropped_fault += faulted
            metrics.failed_sends += failed
        if until > self.now:
            self.now = until

    def pending(self) -> int:
        """Entries still queued (timers of dead nodes included)."""
        return len(self._heap)
