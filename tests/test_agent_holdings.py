"""What other nodes hold, asked through an agent (`Holdings`, `KnownTopics`, `ReadRange`'s
holders), between real `episub node` processes on loopback; and the metrics address an
agent reports."""

from __future__ import annotations

import urllib.request

import pytest

from episub.agent import AgentClient, Record
from episub.proto.messages import HeldSpan
from tests.proc_helpers import (
    TOPIC,
    Processes,
    node_ready,
    start_node,
    wait_for_neighbour,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)


def test_holdings_reports_what_neighbours_and_named_nodes_hold(processes: Processes) -> None:
    a = start_node(processes, "a")
    _, a_address = node_ready(a)
    b = start_node(processes, "b", bootstrap=[a_address])
    node_ready(b)
    a_sock, b_sock = str(processes.dir / "a.sock"), str(processes.dir / "b.sock")
    wait_for_neighbour(b_sock)
    with AgentClient(a_sock) as at_a, AgentClient(b_sock) as at_b:
        published = at_a.publish_batch(TOPIC, [b"%d" % i for i in range(10)])
        publisher = published[0].publisher
        wait_until(lambda: publisher in at_b.offsets(TOPIC), what="b to hold a's stream")
        wait_until(lambda: at_b.offsets(TOPIC)[publisher].count == 10, what="all of it")
        me, neighbour = at_b.holdings(TOPIC, neighbors=True)
        assert me.node_id == at_b.inspect().node_id
        assert neighbour.address == a_address and neighbour.answered
        assert neighbour.spans == [HeldSpan(publisher=publisher, first_seq=0, last_seq=9, count=10)]
        asked = [HeldSpan(publisher=publisher, first_seq=5, last_seq=20)]
        (only_me,) = at_b.holdings(TOPIC, spans=asked)
        assert only_me.spans == [
            HeldSpan(publisher=publisher, first_seq=5, last_seq=9, count=5, since_seq=5)
        ]
        # By address: the node is dialled, and the answer names its id.
        _, by_address = at_b.holdings(TOPIC, addresses=[a_address])
        assert by_address.node_id == publisher and by_address.answered
        assert at_b.known_topics(addresses=[a_address]) == [TOPIC]


def test_a_read_asks_a_holder_that_is_not_a_neighbour(processes: Processes) -> None:
    holder = start_node(processes, "holder")
    _, holder_address = node_ready(holder)
    reader = start_node(processes, "reader")  # a topic of its own: no common neighbour
    node_ready(reader)
    with (
        AgentClient(str(processes.dir / "holder.sock")) as at_holder,
        AgentClient(str(processes.dir / "reader.sock")) as at_reader,
    ):
        rows = [Record(b"row%d" % i, stream=(b"sink/q/0/0", i), timestamp_ms=7) for i in range(5)]
        at_holder.publish_batch(TOPIC, rows)
        (_, found) = at_reader.holdings(TOPIC, addresses=[holder_address])
        assert found.spans == [HeldSpan(publisher=b"sink/q/0/0", first_seq=0, last_seq=4, count=5)]
        got = at_reader.read_range(
            TOPIC, b"sink/q/0/0", 0, 4, fetch_timeout=10, holders=[found.node_id]
        )
        assert [(m.value, m.timestamp_ms) for m in got] == [(b"row%d" % i, 7) for i in range(5)]


def test_an_agent_started_with_a_metrics_port_says_where_to_scrape_it(processes: Processes) -> None:
    node = processes.episub(
        "node", "--socket", str(processes.dir / "m.sock"), "--topic", TOPIC, "--metrics-port", "0"
    )
    node_ready(node)
    with AgentClient(str(processes.dir / "m.sock")) as client:
        url = client.inspect().metrics_url
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert b"episub_published_total" in answer.read()
