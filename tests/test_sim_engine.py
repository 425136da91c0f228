"""The simulator's mechanics, without the real core: a tiny flooding node stands in for it.

What is checked: equal-time events keep their queue order, link latencies are symmetric
pure functions of the seed, loss drops about the share asked for (exact counts with a
fixed seed), crashes and partitions notify connected peers and only them, a send to a
dead peer fails after the round trip, and the same arguments give the same report.
"""

from __future__ import annotations

import hashlib
import json
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from episub.cli import main
from episub.proto.events import (
    ClosePeer,
    ConnectionLost,
    Deliver,
    JoinTopic,
    NeighborUp,
    Publish,
    Published,
    Received,
    ScheduleTimer,
    Send,
    TimerFired,
)
from episub.proto.messages import Envelope, Gossip, LinkKind, Neighbor, NeighborOp
from episub.sim.engine import Simulator
from episub.sim.latency import (
    ConstantLatency,
    CoordsLatency,
    UniformLatency,
    ZonesLatency,
    make_latency,
)
from episub.sim.params import SimParams
from episub.sim.scenarios import ScenarioRun

TOPIC = "t"


class Recorder:
    """Records what it is given; sends what it is told to when a timer fires."""

    def __init__(self, peer: int, rng: random.Random) -> None:
        self.peer = peer
        self.seen: list[tuple[float, object]] = []
        self.script: dict[object, list] = {}  # timer token -> outputs to return

    def handle(self, event, now):
        self.seen.append((now, event))
        if isinstance(event, TimerFired):
            return list(self.script.get(event.token, ()))
        return []


class FloodNode:
    """Floods every new message to every peer it knows; peers come from JOIN contacts.

    Membership is one NEIGHBOR request/accept with the contact, enough for scenarios to run.
    """

    def __init__(self, peer: int, rng: random.Random) -> None:
        self.peer = peer
        self.peers: dict[int, None] = {}
        self.seen: set[bytes] = set()
        self.seq = 0

    def handle(self, event, now):
        if isinstance(event, JoinTopic):
            return [
                Send(p, TOPIC, Neighbor(op=NeighborOp.REQUEST, kind=LinkKind.RAND))
                for p in event.bootstrap
            ]
        if isinstance(event, Publish):
            envelope = Envelope(
                publisher=self.peer, seq=self.seq, timestamp_ms=0, payload=event.payload
            )
            self.seq += 1
            mid = hashlib.blake2s(repr((self.peer, envelope.seq)).encode()).digest()
            self.seen.add(mid)
            out = [Published(TOPIC, mid, envelope)]
            gossip = Gossip(id=mid, envelope=envelope, hops=1)
            return out + [Send(p, TOPIC, gossip) for p in self.peers]
        if isinstance(event, Received):
            msg = event.message
            if isinstance(msg, Neighbor):
                self.peers[event.peer] = None
                out = [NeighborUp(TOPIC, event.peer, msg.kind)]
                if msg.op is NeighborOp.REQUEST:
                    out.append(
                        Send(event.peer, TOPIC, Neighbor(op=NeighborOp.ACCEPT, kind=msg.kind))
                    )
                return out
            if isinstance(msg, Gossip) and msg.id not in self.seen:
                self.seen.add(msg.id)
                fwd = Gossip(id=msg.id, envelope=msg.envelope, hops=msg.hops + 1)
                return [Deliver(TOPIC, msg.id, msg.envelope, msg.hops)] + [
                    Send(p, TOPIC, fwd) for p in self.peers if p != event.peer
                ]
            return []
        if isinstance(event, ConnectionLost):
            self.peers.pop(event.peer, None)
        return []

    def active_view(self, topic):
        return dict.fromkeys(self.peers, LinkKind.RAND)

    def passive_view(self, topic):
        return []


def recorder_sim(n: int, latency: float = 0.01, **kwargs) -> Simulator:
    sim = Simulator(latency=ConstantLatency(latency), seed=7, node_factory=Recorder, **kwargs)
    for node in range(n):
        sim.add_node(node)
    return sim


def ping(peer: int) -> Send:
    return Send(peer, TOPIC, Neighbor(op=NeighborOp.REQUEST, kind=LinkKind.RAND))


def fire(sim: Simulator, node: int, outputs: list, at: float = 0.0) -> None:
    """Make `node` emit `outputs` at time `at` (through a scripted timer)."""
    token = ("script", len(sim.nodes[node].script))
    sim.nodes[node].script[token] = outputs
    sim.input(node, TimerFired(token), at=at)


def received(sim: Simulator, node: int, kind=object) -> list[tuple[float, object]]:
    return [(t, e) for t, e in sim.nodes[node].seen if isinstance(e, kind)]


# -- ordering ------------------------------------------------------------------------------


def test_events_due_at_the_same_time_run_in_the_order_they_were_queued():
    sim = recorder_sim(1)
    for token in [5, 3, 9, 1, 7]:
        sim.input(0, TimerFired(token), at=1.0)
    sim.input(0, TimerFired("early"), at=0.5)
    sim.run(2.0)
    assert [e.token for _, e in sim.nodes[0].seen] == ["early", 5, 3, 9, 1, 7]


def test_timers_fire_after_their_delay_and_sends_arrive_after_the_link_latency():
    sim = recorder_sim(2, latency=0.03)
    fire(sim, 0, [ScheduleTimer(0.25, "later"), ping(1)], at=1.0)
    sim.run(5.0)
    assert [(t, e.token) for t, e in received(sim, 0, TimerFired)][-1] == (1.25, "later")
    ((t, event),) = received(sim, 1, Received)
    assert t == pytest.approx(1.03) and event.peer == 0


def test_hop_cost_is_added_to_every_delivery():
    sim = recorder_sim(2, latency=0.03, hop_cost=0.002)
    fire(sim, 0, [ping(1)])
    sim.run(1.0)
    assert received(sim, 1, Received)[0][0] == pytest.approx(0.032)


def test_run_stops_at_until_and_resumes_where_it_stopped():
    sim = recorder_sim(1)
    for i in range(10):
        sim.input(0, TimerFired(i), at=i * 0.1)
    sim.run(0.45)
    assert len(sim.nodes[0].seen) == 5 and sim.now == 0.45
    sim.run(1.0)
    assert [e.token for _, e in sim.nodes[0].seen] == list(range(10))


def test_a_crash_notice_comes_after_the_messages_sent_before_the_crash():
    sim = recorder_sim(2)
    fire(sim, 0, [ping(1), ping(1)], at=1.0)
    sim.call_at(1.0, lambda: sim.crash(0))  # queued after the sends, same instant
    sim.run(2.0)
    kinds = [type(e).__name__ for _, e in sim.nodes[1].seen]
    assert kinds == ["Received", "Received", "ConnectionLost"]


# -- latency models ------------------------------------------------------------------------

MODELS = [
    lambda seed: ConstantLatency(0.05),
    lambda seed: UniformLatency(seed),
    lambda seed: ZonesLatency(seed, 3),
    lambda seed: CoordsLatency(seed),
]


@pytest.mark.parametrize("make", MODELS)
@given(seed=st.integers(0, 2**40), a=st.integers(0, 10**6), b=st.integers(0, 10**6))
def test_link_latency_is_symmetric_and_a_pure_function_of_seed_and_link(make, seed, a, b):
    first, second = make(seed), make(seed)
    second.one_way(b + 1, a + 2)  # a different history must not matter
    assert first.one_way(a, b) == first.one_way(b, a) == second.one_way(a, b)
    assert first.one_way(a, b) > 0


def test_uniform_latency_spans_10_to_100_ms_and_depends_on_the_seed():
    one, other = UniformLatency(1), UniformLatency(2)
    values = [one.one_way(a, b) for a in range(60) for b in range(a + 1, 60)]
    assert 0.010 <= min(values) < 0.012 and 0.098 < max(values) <= 0.100
    assert sum(values) / len(values) == pytest.approx(0.055, abs=0.003)
    assert values != [other.one_way(a, b) for a in range(60) for b in range(a + 1, 60)]


def test_zones_are_round_robin_with_fast_links_inside_and_slow_ones_between():
    model = ZonesLatency(1, 4)
    assert [model.zone_of(n) for n in range(6)] == [0, 1, 2, 3, 0, 1]
    assert 0.0002 <= model.one_way(0, 4) <= 0.001
    assert 0.020 <= model.one_way(0, 1) <= 0.040


def test_coords_latency_follows_distance_with_a_floor():
    model = CoordsLatency(3)
    (xa, ya), (xb, yb) = model.point(0), model.point(1)
    assert model.one_way(0, 1) == pytest.approx(0.0001 + 0.1 * math.hypot(xa - xb, ya - yb))
    assert model.one_way(5, 5) == pytest.approx(0.0001)
    assert model.zone_of(0) is None
    with pytest.raises(ValueError, match="latency model"):
        make_latency("ring", 1)


# -- loss, connections, failures -----------------------------------------------------------


def send_many(loss: float, count: int = 4000) -> int:
    sim = recorder_sim(2, loss=loss)
    for i in range(count):
        fire(sim, 0, [ping(1)], at=i * 0.001)
    sim.run(10.0)
    return len(received(sim, 1, Received))


def test_loss_drops_about_the_share_asked_for_and_the_same_sends_every_time():
    count, loss = 4000, 0.2
    got = send_many(loss, count)
    sigma = math.sqrt(count * loss * (1 - loss))
    assert abs(got - count * (1 - loss)) < 4 * sigma
    assert got == send_many(loss, count)  # the loss RNG is seeded
    assert send_many(0.0, 100) == 100


def test_a_crash_notifies_connected_live_peers_after_one_latency_and_nobody_else():
    sim = recorder_sim(4, latency=0.02)
    fire(sim, 1, [ping(0)])  # 0-1 connected by 1's send
    fire(sim, 0, [ping(2)])  # 0-2 connected by 0's send
    fire(sim, 3, [ping(2)])  # 3 never talks to 0
    sim.call_at(1.0, lambda: sim.crash(0))
    sim.run(2.0)
    for peer in (1, 2):
        ((t, event),) = received(sim, peer, ConnectionLost)
        assert event.peer == 0 and t == pytest.approx(1.02)
    assert received(sim, 3, ConnectionLost) == []
    assert sim.departed == {0: 1.0}


def test_a_send_to_a_dead_peer_fails_after_the_round_trip_once_per_pending_failure():
    sim = recorder_sim(2, latency=0.02)
    sim.call_at(0.0, lambda: sim.crash(1))
    fire(sim, 0, [ping(1), ping(1)], at=1.0)
    fire(sim, 0, [ping(1)], at=2.0)
    sim.run(3.0)
    lost = received(sim, 0, ConnectionLost)
    assert [(round(t, 6), e.peer) for t, e in lost] == [(1.04, 1), (2.04, 1)]


def test_close_peer_forgets_the_connection_so_a_later_crash_is_not_reported():
    sim = recorder_sim(2)
    fire(sim, 0, [ping(1)], at=0.0)
    fire(sim, 1, [ClosePeer(0)], at=0.5)
    sim.call_at(1.0, lambda: sim.crash(0))
    sim.run(2.0)
    assert not sim.connected(0, 1)
    assert received(sim, 1, ConnectionLost) == []


def test_a_partition_cuts_pairs_across_it_both_ways_and_heals():
    sim = recorder_sim(4, latency=0.01)
    fire(sim, 0, [ping(1), ping(2)])  # 0-1 same side, 0-2 across
    sim.run(0.5)
    sides = bytearray([0, 0, 1, 1])
    sim.call_at(1.0, lambda: sim.partition(sides))
    fire(sim, 1, [ping(3)], at=2.0)  # across the cut: fails after the round trip
    sim.call_at(3.0, sim.heal)
    fire(sim, 1, [ping(3)], at=4.0)  # healed: arrives
    sim.run(5.0)
    assert [(t, e.peer) for t, e in received(sim, 0, ConnectionLost)] == [(1.01, 2)]
    assert [(t, e.peer) for t, e in received(sim, 2, ConnectionLost)] == [(1.01, 0)]
    assert [(t, e.peer) for t, e in received(sim, 1, ConnectionLost)] == [(2.02, 3)]
    assert [t for t, _ in received(sim, 3, Received)] == [4.01]


def test_a_node_that_raises_is_named_in_the_error():
    class Broken(Recorder):
        def handle(self, event, now):
            raise KeyError("boom")

    sim = Simulator(latency=ConstantLatency(0.01), seed=1, node_factory=Broken)
    sim.add_node(3)
    sim.input(3, TimerFired("x"), at=0.25)
    with pytest.raises(RuntimeError, match=r"node 3 failed at t=0\.250000"):
        sim.run(1.0)


# -- scenarios and determinism over the fake -----------------------------------------------


def flood_report(**overrides) -> dict:
    params = SimParams(nodes=60, messages=8, warmup=2, settle=1.0, **overrides)
    return ScenarioRun(params, node_factory=FloodNode).execute()


def test_flooding_reaches_everyone_and_counts_redundant_sends():
    report = flood_report()
    assert report["reliability"] == 1.0 and report["duplicates"] == 0
    # a tree of JOIN links: flooding over it sends exactly one copy per node
    assert report["rmr"] == 0.0
    assert report["ldh"] >= 2 and report["latency_p50_ms"] > 0


def test_same_arguments_give_the_same_report_byte_for_byte():
    overrides = {"scenario": "churn", "loss": 0.05, "latency": "zones", "duration": 2.0}
    first = json.dumps(flood_report(**overrides), sort_keys=True)
    assert first == json.dumps(flood_report(**overrides), sort_keys=True)
    assert first != json.dumps(flood_report(**overrides, seed=2), sort_keys=True)


def test_loss_makes_the_flood_miss_and_the_report_says_so():
    report = flood_report(loss=0.3)
    assert report["reliability"] < 1.0 and report["missed"] > 0
    assert report["dropped_by_loss"] > 0


def test_bad_arguments_exit_with_status_2_and_one_error_line(capsys):
    for argv in (
        ["sim", "steady", "--nodes", "1"],
        ["sim", "steady", "--loss", "1.5"],
        ["sim", "nowhere"],
        ["sim", "steady", "--latency", "ring"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("episub sim: error:") or err[-1].startswith("episub: error:")
