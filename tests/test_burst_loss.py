"""A burst that outruns a stalled neighbour loses nothing for good, on real processes.

Incident (benchmarks/sink_acks.py, local-cluster[2,1,1024], acks=all): a task's 15,000 rows
went out of its executor's node in one burst; a neighbour held 13,637 of them 30 s later
and the task failed with SinkAckTimeout. A neighbour too slow for a burst (here: stopped
with SIGSTOP, as a starved process on a loaded machine is) makes the publisher's wait for
room give up and its send queue to that neighbour overflow: the link closes and the
queue's messages go with it. The other neighbour's queue to it overflows the same way
(IHAVEs included). Once the burst has ended, no later message shows the stalled node its
gap, and no IHAVE comes again: before the catch-up on a link's return (episub/node/catchup.py,
`CatchUp`), the node stayed short for good.

The stalled node runs with a small `held` (max_held_per_publisher), so that what comes
after a gap overflows it, and its subscriber must get every message once, in order: a
message dropped unheld is still in the node's store, where a catch-up sees it as held, so
only delivery from the store (ordering.py) gets it to the subscriber.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from episub.agent import AgentClient, Record
from episub.proto.messages import HeldSpan
from episub.records import Delivery
from tests.proc_helpers import TOPIC, Processes, node_ready, start_node, wait_until

pytestmark = pytest.mark.timeout(200)

# Over SEND_QUEUE_CAP (4,096), so the stalled node's queues overflow whatever else queues.
MESSAGES = 9000
BATCH = 1000  # records per publish_batch, as the sink sends them
STREAM = b"sink/burst/0"  # a named stream, as the sink publishes each task's rows
CAUGHT_UP_WAIT = 60.0  # bound on the repair: a failing build stops here


def test_a_neighbour_stalled_through_a_burst_holds_every_message_after_it_resumes(
    processes: Processes,
) -> None:
    names = ("pub", "other", "stalled")
    first = start_node(processes, "pub")
    address = node_ready(first)[1]
    procs = {"pub": first}
    small_held = processes.config_file({"broadcast": {"max_held_per_publisher": 64}})
    for name in names[1:]:
        config = small_held if name == "stalled" else None
        procs[name] = start_node(processes, name, bootstrap=[address], config=config)
        node_ready(procs[name])
    sockets = {name: str(processes.dir / f"{name}.sock") for name in names}

    def neighbours(name: str) -> int:
        with AgentClient(sockets[name]) as client:
            return len(client.inspect().topics.get(TOPIC, []))

    for name in names:
        wait_until(lambda name=name: neighbours(name) == 2, what=f"{name} linked to both")

    span = HeldSpan(publisher=STREAM, first_seq=0, last_seq=MESSAGES - 1)
    stamp = int(time.time() * 1000)
    reader = AgentClient(sockets["stalled"])
    sub = reader.subscribe(TOPIC, buffer=2 * MESSAGES)
    stalled = procs["stalled"].pid
    os.kill(stalled, signal.SIGSTOP)
    try:
        with AgentClient(sockets["pub"]) as client:
            client.join(TOPIC, [])
            for start in range(0, MESSAGES, BATCH):
                records = [
                    Record(
                        value=b"%d." % seq + b"x" * 100, stream=(STREAM, seq), timestamp_ms=stamp
                    )
                    for seq in range(start, min(MESSAGES, start + BATCH))
                ]
                assert not any(r.duplicate for r in client.publish_batch(TOPIC, records))
            # The burst is over while the node is stopped: it can only learn of what it
            # missed from its neighbours, not from a later message of the stream.
            assert client.inspect().stats["queue_overflows"] >= 1
    finally:
        os.kill(stalled, signal.SIGCONT)

    def held(name: str) -> int:
        with AgentClient(sockets[name]) as client:
            return sum(s.count for n in client.holdings(TOPIC, spans=[span])[:1] for s in n.spans)

    wait_until(
        lambda: all(held(name) == MESSAGES for name in names),
        timeout=CAUGHT_UP_WAIT,
        what=f"every node holding all {MESSAGES} messages",
    )
    with AgentClient(sockets["stalled"]) as client:
        assert client.inspect().stats["catch_ups"] >= 1  # its links' returns compared holdings
    seqs: list[int] = []
    other: list[object] = []
    deadline = time.monotonic() + CAUGHT_UP_WAIT
    with reader:
        while len(seqs) < MESSAGES and time.monotonic() < deadline:
            item = sub.receive(timeout=max(0.0, deadline - time.monotonic()))
            if isinstance(item, Delivery) and item.publisher == STREAM:
                seqs.append(item.seq)
            else:
                other.append(item)  # a Lost or Lagged: fails below
        assert (seqs == list(range(MESSAGES)), other) == (True, [])
