"""Answers a batch at a time in the core (episub/proto/answers.py), one rule each: a PULL
or GRAFT is answered at once up to a batch, the rest as the asker drains (AnswersDrained)
or, with nothing reporting drains, on the core's answer timer; repeats merge, a gone peer's
answers go, and a PULL's seqs the cache lacks are looked up in the core's store within the
same batches (the store's messages go at one hop).
"""

from __future__ import annotations

from episub.proto import messages as m
from episub.proto.answers import MAX_ASKERS, MAX_PENDING_RANGES
from episub.proto.events import (
    AnswersCancelled,
    AnswersDrained,
    ConnectionLost,
    OutEvent,
    Received,
    ScheduleTimer,
    Send,
)
from episub.proto.node import NodeState
from episub.proto.store import RetentionConfig
from tests.core_checks import answer_cost, check_answer
from tests.helpers import (
    TOPIC,
    broadcast,
    broadcast_config,
    envelope,
    fire,
    gossip,
    make_node,
    node_config,
)

ME = b"target"
FEEDER = b"feeder"
ASKER = b"asker"
PUBLISHER = b"publisher"
CACHED = 64
PAYLOAD = 16_000

CONFIG = node_config(broadcast=broadcast_config(max_message_size=16 * 1024))
STORE = RetentionConfig(max_messages=4 * CACHED, max_bytes=4 * CACHED * 16 * 1024)


def loaded_node(config=CONFIG, retention=STORE) -> NodeState:  # type: ignore[no-untyped-def]
    node = make_node(me=ME, active=(FEEDER, ASKER), config=config, retention=retention)
    for seq in range(CACHED):
        message = envelope(PUBLISHER, seq, bytes([seq]) * PAYLOAD)
        node.handle(Received(FEEDER, TOPIC, gossip(message)), 1.0)
    return node


def seqs_sent(outs: list[OutEvent], peer: bytes = ASKER) -> list[int]:
    """The seqs of the messages sent to `peer` in `outs` (GOSSIP or HISTORY packs)."""
    seqs = []
    for out in outs:
        if type(out) is not Send or out.peer != peer:
            continue
        message = out.message
        if type(message) is m.Gossip:
            seqs.append(message.envelope.seq)
        elif type(message) is m.History:
            seqs.extend(m.Envelope.decode(raw).seq for raw in message.envelopes)
    return seqs


def test_a_pull_is_answered_a_batch_at_once_and_the_rest_as_the_asker_drains() -> None:
    node = loaded_node()
    pull = m.Pull(publisher=PUBLISHER, first_seq=0, last_seq=CACHED - 1)
    outs = node.handle(Received(ASKER, TOPIC, pull), 2.0)
    first = seqs_sent(outs)
    assert first == list(range(len(first)))
    assert 1 <= len(first) < CACHED  # 64 KiB of 16 KB messages: a few
    got = list(first)
    for step in range(CACHED):
        batch = seqs_sent(node.handle(AnswersDrained(ASKER), 2.0 + step))
        if not batch:
            break
        assert len(batch) <= len(first)
        got += batch
    assert got == list(range(CACHED))  # every one, once, in order
    assert seqs_sent(node.handle(AnswersDrained(ASKER), 9.0)) == []
    assert broadcast(node).answers.waiting(ASKER) == 0


def test_a_graft_over_cached_ranges_is_answered_in_batches_too() -> None:
    node = loaded_node()
    graft = m.Graft(ranges=((PUBLISHER, 0, CACHED - 1, 0),))
    outs = node.handle(Received(ASKER, TOPIC, graft), 2.0)
    got = seqs_sent(outs)
    assert 1 <= len(got) < CACHED
    while batch := seqs_sent(node.handle(AnswersDrained(ASKER), 3.0)):
        got += batch
    assert got == list(range(CACHED))


def test_a_request_from_a_peer_with_answers_waiting_waits_its_turn_and_repeats_merge() -> None:
    node = loaded_node()
    pull = m.Pull(publisher=PUBLISHER, first_seq=0, last_seq=CACHED - 1)
    first = seqs_sent(node.handle(Received(ASKER, TOPIC, pull), 2.0))
    b = broadcast(node)
    repeat = pull  # its first batch went already: a repeat sends it no more
    for _ in range(99):
        assert seqs_sent(node.handle(Received(ASKER, TOPIC, repeat), 2.0)) == []
    assert b.counters.answer_ranges_merged == 99
    assert b.answers.waiting(ASKER) == 1
    got = list(first)
    while batch := seqs_sent(node.handle(AnswersDrained(ASKER), 3.0)):
        got += batch
    assert got == list(range(CACHED))  # the repeats cost nothing more


def test_a_gone_peers_waiting_answers_are_not_made() -> None:
    for gone in (AnswersCancelled(ASKER), ConnectionLost(ASKER)):
        node = loaded_node()
        pull = m.Pull(publisher=PUBLISHER, first_seq=0, last_seq=CACHED - 1)
        node.handle(Received(ASKER, TOPIC, pull), 2.0)
        assert broadcast(node).answers.waiting(ASKER) == 1
        node.handle(gone, 2.5)
        assert broadcast(node).answers.waiting(ASKER) == 0
        assert seqs_sent(node.handle(AnswersDrained(ASKER), 3.0)) == []


def test_the_store_is_looked_up_a_batch_of_seqs_at_a_time_as_the_asker_drains() -> None:
    node = loaded_node()
    config = CONFIG.broadcast
    pull = m.Pull(publisher=b"elsewhere", first_seq=0, last_seq=m.MAX_PULL_SPAN - 1)
    work = node.store.work
    assert seqs_sent(node.handle(Received(ASKER, TOPIC, pull), 2.0)) == []  # none held
    assert node.store.work - work == config.answer_batch_messages
    batches = 1
    while broadcast(node).answers.waiting(ASKER):
        work = node.store.work
        assert seqs_sent(node.handle(AnswersDrained(ASKER), 2.1)) == []
        assert node.store.work - work <= config.answer_batch_messages
        batches += 1
    assert batches == m.MAX_PULL_SPAN // config.answer_batch_messages


def test_a_pull_past_the_store_s_bounds_gets_what_it_holds_one_hop_further() -> None:
    small = RetentionConfig(max_messages=8, max_bytes=1 << 30)
    node = loaded_node(retention=small)
    assert len(node.store) == 8
    pull = m.Pull(publisher=PUBLISHER, first_seq=0, last_seq=CACHED - 1)
    outs = node.handle(Received(ASKER, TOPIC, pull), 2.0)
    got = seqs_sent(outs)
    hops = [h for o in outs if type(o) is Send for h in o.message.hops]  # type: ignore[union-attr]
    assert got and set(hops) == {2}  # received at one hop, sent on at two
    while batch := seqs_sent(node.handle(AnswersDrained(ASKER), 3.0)):
        got += batch
    assert got == list(range(CACHED - 8, CACHED))  # the 8 held, once, in order


def test_without_drains_the_answer_timer_serves_the_next_batch() -> None:
    node = loaded_node()
    pull = m.Pull(publisher=PUBLISHER, first_seq=0, last_seq=CACHED - 1)
    outs = node.handle(Received(ASKER, TOPIC, pull), 2.0)
    timers = [o for o in outs if type(o) is ScheduleTimer and o.token[-1] == "answers"]
    assert [t.delay for t in timers] == [CONFIG.broadcast.answer_interval]
    got = seqs_sent(outs)
    now = 2.0
    while len(got) < CACHED:
        now += CONFIG.broadcast.answer_interval or 0.0
        batch = seqs_sent(fire(node, "answers", now))
        assert batch
        got += batch
    assert got == list(range(CACHED))


def test_the_runtime_turns_the_answer_timer_off() -> None:
    from episub.net.runtime import with_runtime_upkeep

    config = with_runtime_upkeep(CONFIG, kernel_rtt=False)
    assert config.broadcast.answer_interval is None
    node = loaded_node(config)
    pull = m.Pull(publisher=PUBLISHER, first_seq=0, last_seq=CACHED - 1)
    outs = node.handle(Received(ASKER, TOPIC, pull), 2.0)
    assert not [o for o in outs if type(o) is ScheduleTimer and o.token[-1] == "answers"]


def test_every_batch_keeps_the_amplification_bounds() -> None:
    node = loaded_node()
    pull = m.Pull(publisher=PUBLISHER, first_seq=0, last_seq=CACHED - 1)
    work = node.store.work
    outs = node.handle(Received(ASKER, TOPIC, pull), 2.0)
    check_answer(answer_cost(ASKER, TOPIC, pull, outs, node.store.work - work), CONFIG, "PULL")
    for _ in range(CACHED):
        work = node.store.work
        outs = node.handle(AnswersDrained(ASKER), 3.0)
        cost = answer_cost(ASKER, TOPIC, pull, outs, node.store.work - work)
        check_answer(cost, CONFIG, "a drained batch")


def test_waiting_answers_are_bounded_per_peer_and_in_peers() -> None:
    node = loaded_node()
    b = broadcast(node)
    cached = tuple((PUBLISHER, seq, seq, 0) for seq in range(CACHED))
    node.handle(Received(ASKER, TOPIC, m.Graft(ranges=cached)), 2.0)  # a batch, the rest waits
    for round_ in range(MAX_PENDING_RANGES // CACHED + 2):
        far = tuple((PUBLISHER, 10_000 + round_ * CACHED + i, 10_000 + round_ * CACHED + i, 0)
                    for i in range(CACHED))  # fmt: skip
        node.handle(Received(ASKER, TOPIC, m.Graft(ranges=far)), 2.0 + round_)
    assert b.answers.waiting(ASKER) == MAX_PENDING_RANGES
    assert b.counters.answer_ranges_refused > 0
    pull = m.Pull(publisher=PUBLISHER, first_seq=0, last_seq=CACHED - 1)
    for i in range(MAX_ASKERS + 5):
        node.handle(Received(b"asker-%04d" % i, TOPIC, pull), 3.0)
    assert len(b.answers) == MAX_ASKERS
    assert b.counters.answer_askers_evicted == 6  # ASKER's, and the first 5 of these


def test_a_graft_waiting_goes_before_a_pull_waiting() -> None:
    node = loaded_node()
    pull = m.Pull(publisher=PUBLISHER, first_seq=0, last_seq=CACHED // 2 - 1)
    first = seqs_sent(node.handle(Received(ASKER, TOPIC, pull), 2.0))
    graft = m.Graft(ranges=((PUBLISHER, CACHED - 2, CACHED - 1, 0),))
    assert seqs_sent(node.handle(Received(ASKER, TOPIC, graft), 2.1)) == []  # its turn comes
    batch = seqs_sent(node.handle(AnswersDrained(ASKER), 2.2))
    assert batch[:2] == [CACHED - 2, CACHED - 1]  # then the PULL's go on in the same batch
    rest = batch[2:]
    while batch := seqs_sent(node.handle(AnswersDrained(ASKER), 2.3)):
        rest += batch
    assert first + rest == list(range(CACHED // 2))
