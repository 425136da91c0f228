"""Hub links (MembershipConfig.hub_links, BroadcastConfig.hub_parent): a configuration
topic is a star around the node the others join through. Nodes wired in memory
(tests/helpers.Network) with the configuration topics' own settings
(episub/proto/config.py CONFIG_TOPIC_MEMBERSHIP, CONFIG_TOPIC_BROADCAST)."""

from __future__ import annotations

import random

from episub.config.replica import config_topic
from episub.proto import messages as m
from episub.proto.events import ConnectionLost, JoinTopic, Publish, Send, TimerFired
from episub.proto.node import NodeState
from tests.helpers import NEAR, RAND, Network, membership, node_config

CONFIG = config_topic("default")
HUB = 0


def star(readers: int) -> Network:
    """A hub and `readers` nodes that join through it, one after the other, each with its
    first stabilisation rounds run (own links grown)."""
    cfg = node_config()
    nodes = [NodeState(p, cfg, random.Random(p)) for p in range(readers + 1)]
    net = Network(nodes)
    net.handle(HUB, JoinTopic(CONFIG), 0.0)
    for p in range(1, readers + 1):
        net.handle(p, JoinTopic(CONFIG, (HUB,)), 0.0)
    for now in (2.0, 4.0, 6.0):
        for p in range(readers + 1):
            fire_all(net, p, "stabilize", now)
    return net


def fire_all(net: Network, me: int, name: str, now: float) -> dict:
    node = net.nodes[me]
    return net.handle(me, TimerFired((CONFIG, node._generations[CONFIG], name)), now)


def test_the_contact_keeps_every_joiner_linked_beyond_its_view_and_each_end_holds_it_beside_a():
    net = star(20)
    hub = membership(net.nodes[HUB], CONFIG)
    assert hub.config.max_active < 20  # a plain HyParView view would turn joiners away
    assert set(hub.active) == set(range(1, 21))
    assert all(link.hub and link.kind is NEAR for link in hub.active.values())
    for p in range(1, 21):
        reader = membership(net.nodes[p], CONFIG)
        assert reader.active[HUB].hub and reader.active[HUB].kind is NEAR
        own = [q for q, link in reader.active.items() if q != HUB]
        assert own, f"reader {p} has no link of its own: it is cut off if the hub goes"
        assert all(reader.active[q].kind is RAND and not reader.active[q].hub for q in own)
        assert reader.own_count() == len(own) <= reader.config.max_active


def test_every_reader_gets_the_contacts_writes_from_the_contact_and_relays_none():
    net = star(16)
    log = net.handle(HUB, Publish(CONFIG, b"v1"), 10.0)
    hub_sends = [e for e in log[HUB] if isinstance(e, Send) and isinstance(e.message, m.Gossip)]
    assert {e.peer for e in hub_sends} == set(range(1, 17))
    for p in range(1, 17):
        relayed = [e for e in log[p] if isinstance(e, Send) and isinstance(e.message, m.Gossip)]
        assert relayed == [], f"reader {p} relayed the write"
        assert net.nodes[p].eager_peers(CONFIG) == [HUB]


def test_a_readers_write_goes_to_the_contact_then_to_every_other_reader():
    net = star(8)
    log = net.handle(3, Publish(CONFIG, b"from a reader"), 10.0)
    first = [e.peer for e in log[3] if isinstance(e, Send) and isinstance(e.message, m.Gossip)]
    assert first == [HUB]
    by_hub = {e.peer for e in log[HUB] if isinstance(e, Send) and isinstance(e.message, m.Gossip)}
    assert by_hub == set(range(1, 9)) - {3}


def test_without_the_contact_the_readers_carry_a_write_over_their_own_links():
    net = star(12)
    del net.nodes[HUB]
    for p in range(1, 13):
        net.handle(p, ConnectionLost(HUB), 10.0)
    log = net.handle(5, Publish(CONFIG, b"hub gone"), 10.0)
    got = {p for p, out in log.items() if any(type(e).__name__ == "Deliver" for e in out)}
    now = 10.0
    for _ in range(12):  # IHAVE flushes and GRAFTs repair what the eager push missed
        now += 0.5
        for p in range(1, 13):
            for name in ("ihave", "missing"):
                log = fire_all(net, p, name, now)
                got |= {
                    q for q, out in log.items() if any(type(e).__name__ == "Deliver" for e in out)
                }
    assert got == set(range(1, 13)) - {5}


def test_past_hub_links_joiners_join_as_in_hyparview():
    cfg = node_config()
    limit = cfg.for_topic(CONFIG).membership.hub_links
    net = star(limit + 6)
    hub = membership(net.nodes[HUB], CONFIG)
    assert hub.hub_count() == limit
    late = [
        p for p in range(limit + 1, limit + 7) if HUB not in membership(net.nodes[p], CONFIG).active
    ]
    assert late, "every joiner got a hub link past the bound"
    assert all(membership(net.nodes[p], CONFIG).active for p in late)


def test_a_contact_holding_only_hub_links_is_settled_and_its_upkeep_slows_down():
    """Settled (MembershipConfig.settled_upkeep, the runtime's): pings every minute, one end
    of a link only. With its hub links not counted as held, the contact looked short of
    links for good and pinged all of them every 10 s, on the tick all nodes share."""
    net = star(12)
    hub = membership(net.nodes[HUB], CONFIG)
    assert hub.link_count() == 0 and not hub.passive
    assert hub.settled()
