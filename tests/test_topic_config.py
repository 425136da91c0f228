"""Per-topic settings: configuration topics (`_episub.config.*`) flush IHAVEs less often than
data topics (episub/proto/config.py, CONFIG_TOPIC_BROADCAST), keep random links only, no
near links, their contact holding a hub link to each joiner (CONFIG_TOPIC_MEMBERSHIP), and
nothing else about them changes."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from episub.config.replica import config_topic
from episub.proto import messages as m
from episub.proto.config import NodeConfig
from episub.proto.events import (
    ConnectionLost,
    JoinTopic,
    Publish,
    Received,
    ScheduleTimer,
    Send,
)
from episub.proto.messages import LinkKind
from episub.proto.node import NodeState
from episub.proto.reserved import CONFIG_TOPIC_PREFIX
from tests.helpers import broadcast_config, fire, make_node, node_config, token

CONFIG = config_topic("default")


def assert_only_changed(topic_section: object, node_section: object, fields: tuple[str, ...]):
    """The topic's section of the config equals the node's but for `fields`."""
    restored = replace(topic_section, **{f: getattr(node_section, f) for f in fields})  # type: ignore[type-var]
    assert restored == node_section


def test_a_config_topic_takes_the_config_broadcast_changes_and_keeps_every_other_field():
    cfg = node_config(broadcast=broadcast_config(max_message_size=4096))
    topic_cfg = cfg.for_topic(CONFIG)
    assert topic_cfg.broadcast.ihave_interval == 1.0
    assert topic_cfg.broadcast.ihave_spread == 1.0
    assert topic_cfg.broadcast.graft_timeout == 0.5
    assert topic_cfg.broadcast.graft_grace == 1.4
    assert topic_cfg.broadcast.max_message_size == 4096  # the node's own setting stays
    assert topic_cfg.broadcast.hub_parent
    assert topic_cfg.broadcast.heads_quiet == 4.0
    assert topic_cfg.broadcast.max_stream_trees == 0
    assert_only_changed(
        topic_cfg.broadcast,
        cfg.broadcast,
        (
            "ihave_interval",
            "ihave_spread",
            "graft_grace",
            "graft_timeout",
            "hub_parent",
            "heads_quiet",
            "max_stream_trees",
        ),
    )


def test_a_config_topic_takes_the_config_membership_changes_and_keeps_every_other_field():
    cfg = node_config()
    m = cfg.for_topic(CONFIG).membership
    assert not m.proximity
    assert m.hub_links == 64
    assert (m.c_rand, m.c_near) == (3, 0)
    assert m.passive_probe_interval == m.passive_probe_interval_unmeasured == 12.0
    assert m.passive_probes_per_tick_unmeasured == 1
    assert m.recovery_max_retry == 4.0
    assert_only_changed(
        m,
        cfg.membership,
        ("proximity", "hub_links", "c_rand", "c_near", "passive_probe_interval",
         "passive_probe_interval_unmeasured", "passive_probes_per_tick_unmeasured",
         "recovery_max_retry"),
    )  # fmt: skip


def test_a_config_topic_node_cut_off_asks_its_contact_again_at_least_every_4_s():
    """A host cut off past TCP's user timeout loses every link; its replica holds stale
    values until it links again, so its attempts stay 4 s apart however long the cut (a
    data topic's grow to 60 s)."""
    node = NodeState(b"me", node_config(), random.Random(0))
    node.handle(JoinTopic(CONFIG, (b"hub",)), 0.0)
    high = m.Neighbor(op=m.NeighborOp.REQUEST, kind=LinkKind.RAND, high_priority=True,
                      active_count=1, rand_count=1)  # fmt: skip
    node.handle(Received(b"hub", CONFIG, high), 0.5)  # the contact took our JOIN in
    out = node.handle(ConnectionLost(b"hub"), 1.0)
    waits = [e.delay for e in out if isinstance(e, ScheduleTimer) and e.token[-1] == "recover"]
    now = 1.0
    for _ in range(8):  # the cut goes on: every attempt fails
        now += waits[-1]
        out = fire(node, "recover", now, topic=CONFIG)
        assert Send(b"hub", CONFIG, m.GetNodes()) in out
        waits += [e.delay for e in out if isinstance(e, ScheduleTimer) and e.token[-1] == "recover"]
    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0]


def test_a_config_topic_overlay_makes_no_near_links_and_runs_no_optimisation():
    node = make_node(active=(1, 2), topic=CONFIG)
    topic = node._topics[CONFIG]
    assert not topic.membership.config.proximity
    assert topic.broadcast.rtts is None  # no near-parent rule either


def test_any_other_topic_runs_with_the_node_config_as_it_is():
    cfg = node_config()
    assert cfg.for_topic("prices") is cfg
    assert cfg.for_topic("_episub.other") is cfg


def test_the_config_topic_prefix_is_the_replicas():
    assert CONFIG.startswith(CONFIG_TOPIC_PREFIX)


def test_topic_broadcast_changes_are_checked_when_the_config_is_made():
    with pytest.raises(ValueError, match="ihave_interval"):
        NodeConfig(topic_broadcast=(("t.", (("ihave_interval", 0.0),)),))
    with pytest.raises(TypeError):
        NodeConfig(topic_broadcast=(("t.", (("no_such_field", 1.0),)),))


def test_topic_membership_changes_are_checked_when_the_config_is_made():
    with pytest.raises(ValueError, match="c_rand"):
        NodeConfig(topic_membership=(("t.", (("c_rand", 0),)),))


def test_no_topic_changes_leave_config_topics_as_data_topics():
    cfg = NodeConfig(topic_broadcast=(), topic_membership=())
    assert cfg.for_topic(CONFIG) is cfg


@pytest.mark.parametrize(("topic", "low", "high"), [(CONFIG, 0.5, 1.5), ("prices", 0.125, 0.125)])
def test_a_publish_arms_the_ihave_flush_at_its_topics_interval(topic: str, low: float, high: float):
    node = make_node(active=(1, 2), topic=topic)
    out = node.handle(Publish(topic, b"v"), 1.0)
    timers = [o for o in out if isinstance(o, ScheduleTimer) and o.token[-1] == "ihave"]
    assert timers == [ScheduleTimer(timers[0].delay, token("ihave", topic=topic))]
    assert low <= timers[0].delay <= high


def test_config_topic_nodes_flush_their_ihaves_at_periods_of_their_own():
    """ihave_spread: nodes fed the same writes at once flush at different times (all at
    the same one, each ~20th write of the config benchmark met every reader's flush)."""
    periods = set()
    for me in range(20):
        node = make_node(me=me, active=(100, 101), topic=CONFIG)
        out = node.handle(Publish(CONFIG, b"v"), 1.0)
        (timer,) = [o for o in out if isinstance(o, ScheduleTimer) and o.token[-1] == "ihave"]
        periods.add(timer.delay)
    assert len(periods) == 20
    assert min(periods) >= 0.5 and max(periods) <= 1.5
