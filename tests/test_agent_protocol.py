"""The agent protocol's rules, with the agent in this process: bounds, paging, ends.

The agent (a Node, AgentService and AgentServer) runs under trio in a background thread,
with small limits; the test thread talks to it with the blocking AgentClient, as a Spark
worker would. Pure parts (the frame decoder, option loading) are tested without any
socket.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from episub import BroadcastConfig, Node, NodeConfig
from episub.agent import (
    AgentAtLimit,
    AgentBadRequest,
    AgentBootstrapFailed,
    AgentClient,
    AgentError,
    AgentSubscription,
    AgentTooLarge,
    AgentWaitExpired,
    Record,
)
from episub.agent import agent_pb2 as pb
from episub.agent.options import UsageError, load_key, load_link_delay
from episub.agent.server import AgentServer
from episub.agent.service import AgentLimits, AgentService
from episub.agent.wire import (
    delivery_to_pb,
    envelope_rows_to_pb,
    item_from_pb,
    item_to_pb,
    rows_from_pb,
    rows_to_pb,
)
from episub.node.retained import delivery_of
from episub.proto.envelope import Envelope
from episub.proto.store import Span
from episub.recordbatch import BATCH_HEADER, is_batch
from episub.recordbatch import encode as encode_batch
from episub.subscription import Delivery, Lagged, Lost
from tests.proc_helpers import KEY, TOPIC, WAIT, socket_dir

pytestmark = pytest.mark.timeout(60)


@contextmanager
def agent(**limits: int) -> Iterator[str]:
    """An agent in a background thread, serving a fresh socket; yields its path."""
    directory = socket_dir()
    path = str(Path(directory) / "agent.sock")
    ready = threading.Event()
    stop: list[Callable[[], None]] = []
    errors: list[BaseException] = []

    async def main() -> None:
        config = NodeConfig(broadcast=BroadcastConfig(max_message_size=1000))
        async with Node(key=KEY, config=config) as node, trio.open_nursery() as nursery:
            service = AgentService(node, limits=AgentLimits(**limits))
            await nursery.start(service.run)
            await nursery.start(AgentServer(service, path).run)
            await service.join(TOPIC)
            token = trio.lowlevel.current_trio_token()
            stop.append(lambda: token.run_sync_soon(nursery.cancel_scope.cancel))
            ready.set()

    def thread() -> None:
        try:
            trio.run(main)
        except BaseException as exc:
            errors.append(exc)
            ready.set()

    runner = threading.Thread(target=thread, daemon=True)
    runner.start()
    assert ready.wait(WAIT), "the agent did not start"
    assert not errors, errors
    try:
        yield path
    finally:
        stop[0]()
        runner.join(WAIT)
        shutil.rmtree(directory, ignore_errors=True)
        assert not errors, errors


def message(seq: int, value: bytes = b"v") -> Delivery:
    return Delivery(
        topic=TOPIC, publisher=b"p", seq=seq, timestamp_ms=0, key=None, value=value,
        headers=(), id=b"%d" % seq,
    )  # fmt: skip


# -- through a socket -------------------------------------------------------------------------


def test_publish_reports_publisher_and_seq_and_offsets_follow() -> None:
    with agent() as path, AgentClient(path) as client:
        first = client.publish(TOPIC, b"a", key=b"k", headers={"h": b"1"})
        batch = client.publish_batch(TOPIC, [b"b", Record(b"c", None, (("x", b"y"),))])
        assert [p.seq for p in [first, *batch]] == [0, 1, 2]
        assert {p.publisher for p in batch} == {first.publisher}
        assert client.offsets(TOPIC) == {first.publisher: Span(0, 2, 3)}
        assert client.offsets("never-joined") == {}
        got = client.read_range(TOPIC, first.publisher, 0, 2)
        assert [(m.seq, m.value, m.id) for m in got] == [
            (0, b"a", first.id),
            (1, b"b", batch[0].id),
            (2, b"c", batch[1].id),
        ]
        assert got[0].key == b"k" and got[0].headers == (("h", b"1"),)


def test_records_at_named_stream_places_are_published_once_and_counted_in_offsets() -> None:
    place = b"sink/q/3/1"
    with agent() as path, AgentClient(path) as client:
        rows = [Record(b"r0", stream=(place, 0)), Record(b"r1", stream=(place, 1))]
        first = client.publish_batch(TOPIC, rows)
        again = client.publish_batch(TOPIC, [*rows, Record(b"r2", stream=(place, 2))])
        assert [(p.publisher, p.seq, p.duplicate) for p in first] == [
            (place, 0, False),
            (place, 1, False),
        ]
        assert [p.duplicate for p in again] == [True, True, False]
        assert [p.id for p in again[:2]] == [p.id for p in first]
        assert client.offsets(TOPIC) == {place: Span(0, 2, 3)}
        got = client.read_range(TOPIC, place, 0, 2)
        assert [m.value for m in got] == [b"r0", b"r1", b"r2"]
        with pytest.raises(ValueError, match="stream's publisher"):  # checked at the client
            Record(b"x", stream=(b"", 0))
        # ... and again where a request enters the agent, from any client
        bad = pb.Record(value=b"x", stream=pb.StreamPlace(publisher=b"", seq=0))
        fine = pb.Record(value=b"fine")
        with pytest.raises(AgentError, match="record 1 of 2: a stream's publisher") as refused:
            client._call(publish_batch=pb.PublishBatch(topic=TOPIC, records=[fine, bad]))
        assert isinstance(refused.value, AgentBadRequest)


def test_join_is_idempotent_and_leave_forgets_the_topic_but_not_what_retention_holds() -> None:
    with agent() as path, AgentClient(path) as client:
        client.join(TOPIC)  # joined at start already: a no-op
        client.join("other")
        published = client.publish("other", b"x")
        assert len(client.offsets("other")) == 1
        assert sorted(client.inspect().topics) == ["other", TOPIC]
        client.leave("other")
        assert list(client.inspect().topics) == [TOPIC]
        assert client.offsets("other") == {published.publisher: Span(0, 0, 1)}
        with pytest.raises(AgentError, match="not joined to topic 'other'"):
            client.leave("other")
        with pytest.raises(AgentError, match="could not reach any bootstrap") as raised:
            client.join("third", ["127.0.0.1:1"])
        assert isinstance(raised.value, AgentBootstrapFailed)
        assert list(client.inspect().topics) == [TOPIC]


def test_a_join_through_a_node_outside_the_topic_times_out_when_asked_and_stays_joined() -> None:
    """The driver's node joins a sink's topic through outside nodes that may not follow it:
    it asks for a short wait, and goes on as the topic's first node (issue 15)."""
    with agent() as outside_path, agent() as path, AgentClient(path) as client:
        with AgentClient(outside_path) as outside:
            address = outside.inspect().address
        with pytest.raises(AgentError, match=r"no neighbour came within 0\.3 s") as raised:
            client.join("theirs-not", [address], timeout=0.3)
        assert isinstance(raised.value, AgentWaitExpired)
        assert "theirs-not" in client.inspect().topics
        client.publish("theirs-not", b"x")  # joined: publishing works
        for bad in (-1.0, 1e6, float("nan")):
            with pytest.raises(AgentError, match="join timeout must be in") as refused:
                client.join("another", [address], timeout=bad)
            assert isinstance(refused.value, AgentBadRequest)
        assert "another" not in client.inspect().topics


def test_a_read_range_bigger_than_a_page_comes_in_several_replies() -> None:
    with agent(read_page_messages=3) as path, AgentClient(path) as client:
        published = client.publish_batch(TOPIC, [b"%d" % i for i in range(10)])
        publisher = published[0].publisher
        assert [m.seq for m in client.read_range(TOPIC, publisher, 2, 8)] == list(range(2, 9))
        assert client.read_range(TOPIC, publisher, 20, 30) == []
        assert client.inspect().stats["agent_requests"] >= 3


def test_a_read_range_as_rows_gives_each_page_s_messages_as_columns() -> None:
    records = [
        Record(b"v%d" % i, key=None if i % 3 else b"k%d" % i, headers=[("h", b"%d" % i)] * (i % 2))
        for i in range(10)
    ]
    with agent(read_page_messages=3) as path, AgentClient(path) as client:
        publisher = client.publish_batch(TOPIC, records)[0].publisher
        expected = client.read_range(TOPIC, publisher, 1, 8)
        pages = list(client.read_range_rows(TOPIC, publisher, 1, 8))
        assert [p.rows.rows for p in pages] == [3, 3, 2]
        got = [
            (int.from_bytes(p.seqs[8 * i : 8 * i + 8], "little"), p.rows.row(i))
            for p in pages
            for i in range(p.rows.rows)
        ]
        assert [(seq, r.timestamp_ms, r.key, r.value, r.headers) for seq, r in got] == [
            (m.seq, m.timestamp_ms, m.key, m.value, m.headers) for m in expected
        ]
        assert all(p.batches == [] for p in pages)
        assert {p.rows.rows for p in client.read_range_rows(TOPIC, publisher, 20, 30)} == {0}
        with pytest.raises(AgentError, match="as_rows and value_prefix") as refused:
            body = pb.ReadRange(topic=TOPIC, publisher=publisher, last_seq=1, as_rows=True)
            body.value_prefix = 8
            client._call(read_range=body)
        assert refused.value.kind == "bad_request"


def test_a_record_batch_message_in_a_page_as_rows_comes_as_it_is() -> None:
    with agent() as path, AgentClient(path) as client:
        stream = (b"s", 0)
        client.publish(TOPIC, b"plain", stream=stream, timestamp_ms=5)
        client.publish(TOPIC, encode_batch(1, [(6, None, b"r", ())]), stream=(b"s", 1),
                       headers=[(BATCH_HEADER, b"1")])  # fmt: skip
        (page,) = client.read_range_rows(TOPIC, b"s", 0, 1)
        assert page.rows.rows == 1 and page.rows.row(0).value == b"plain"
        assert [(m.seq, is_batch(m.headers)) for m in page.batches] == [(1, True)]


def test_a_page_as_rows_reads_the_same_from_an_agent_that_sent_one_delivery_each() -> None:
    """rows_from_pb turns a page of Deliveries (an agent that ignores as_rows) into the
    columns an as_rows page carries, record batches set apart as such a page sets them."""

    def delivery(seq: int, key: bytes | None, headers: tuple, value: bytes) -> Delivery:
        return Delivery(
            topic="t", publisher=b"p", seq=seq, timestamp_ms=10 + seq, key=key, value=value,
            headers=headers, id=b"i",
        )  # fmt: skip

    plain = [
        delivery(3, None, (), b"a"),
        delivery(4, b"k", (("h", b"1"),), b"b"),
        delivery(6, b"", (), b""),
    ]
    batch = delivery(7, None, ((BATCH_HEADER, b"1"),), b"rows")
    as_rows, old = pb.Messages(next_seq=8), pb.Messages(next_seq=8)
    rows_to_pb([*plain, batch], as_rows)
    old.messages.extend(delivery_to_pb(m) for m in [*plain, batch])
    for page in (rows_from_pb(as_rows), rows_from_pb(old)):
        assert bytes(page.seqs) == b"".join(m.seq.to_bytes(8, "little") for m in plain)
        assert [(r.timestamp_ms, r.key, r.value, r.headers) for r in page.rows] == [
            (m.timestamp_ms, m.key, m.value, m.headers) for m in plain
        ]
        assert page.batches == [batch]


def test_a_page_of_envelopes_as_rows_is_the_page_of_their_deliveries() -> None:
    """The agent frames plain rows from the envelopes retention holds (no Delivery each):
    the same bytes as from their Deliveries, empty and absent keys and values kept apart."""
    publisher = b"127.0.0.1:7000/0123456789abcdef"
    envelopes = [
        Envelope(publisher=publisher, seq=3, timestamp_ms=13, payload=b"a"),
        Envelope(publisher=publisher, seq=4, timestamp_ms=14, payload=b"b", key=b"k",
                 headers=(("h", b"1"), ("g", b""))),
        Envelope(publisher=publisher, seq=6, timestamp_ms=16, payload=b"", key=b""),
    ]  # fmt: skip
    deliveries = [delivery_of("t", bytes(32), e) for e in envelopes]
    from_envelopes, from_deliveries = pb.Messages(next_seq=7), pb.Messages(next_seq=7)
    envelope_rows_to_pb(envelopes, from_envelopes)
    rows_to_pb(deliveries, from_deliveries)
    assert from_envelopes.SerializeToString() == from_deliveries.SerializeToString()
    page = rows_from_pb(from_envelopes)
    assert [(r.key, r.value, r.headers) for r in page.rows] == [
        (None, b"a", ()), (b"k", b"b", (("h", b"1"), ("g", b""))), (b"", b"", ()),
    ]  # fmt: skip


def test_a_batch_is_all_or_nothing_when_one_record_is_too_large() -> None:
    with agent() as path, AgentClient(path) as client:
        with pytest.raises(AgentError, match="record 1 of 2: message of 1001 bytes") as raised:
            client.publish_batch(TOPIC, [b"ok", b"x" * 1001])
        assert isinstance(raised.value, AgentTooLarge)
        assert client.offsets(TOPIC) == {}  # nothing was published
        assert client.publish(TOPIC, b"next").seq == 0


def test_every_client_bound_is_enforced_with_a_clear_error() -> None:
    limits = {"max_clients": 2, "max_subscriptions": 1, "max_subscription_buffer": 10}
    with agent(**limits) as path, AgentClient(path) as client:
        with pytest.raises(AgentError, match="at most 10 items, not 11"):
            client.subscribe(TOPIC, buffer=11)
        with (
            client.subscribe(TOPIC, buffer=10),
            pytest.raises(AgentError, match="at most 1 subscriptions per client"),
        ):
            client.subscribe(TOPIC, buffer=5)
        with AgentClient(path) as second:
            second.inspect()
            with pytest.raises(AgentError, match="at most 2 clients") as raised:
                AgentClient(path).inspect()
            assert isinstance(raised.value, AgentAtLimit)
        with pytest.raises(AgentError, match="at most 64 bootstrap addresses, not 65"):
            client.join("other", [f"127.0.0.1:{1000 + i}" for i in range(65)])


def test_items_that_arrive_while_a_call_waits_are_held_for_the_subscription() -> None:
    with agent() as path, AgentClient(path) as client:
        sub = client.subscribe(TOPIC, buffer=100)
        client.publish_batch(TOPIC, [b"%d" % i for i in range(5)])
        client.inspect()
        assert [sub.receive(WAIT).seq for _ in range(5)] == list(range(5))  # type: ignore[union-attr]
        sub.close()
        assert sub.receive(WAIT) is None and sub.ended == "closed"
        client.publish(TOPIC, b"more")  # the connection carries on


def test_held_items_are_bounded_and_what_is_dropped_is_reported_in_place() -> None:
    # The client's side alone, fed responses as they would arrive: buffer 2, then 3 items
    # dropped here and 4 reported dropped by the agent, then the end.
    client = SimpleNamespace(_subscriptions={})  # all a subscription touches of its client
    sub = AgentSubscription(client, 1, TOPIC, buffer=2)  # type: ignore[arg-type]

    def item(seq: int) -> pb.Response:
        return pb.Response(id=1, item=item_to_pb(message(seq)))

    for seq in range(5):
        sub._take(item(seq))
    sub._take(pb.Response(id=1, item=pb.Item(lagged=pb.Lagged(count=4))))
    sub._take(pb.Response(id=1, end=pb.End(reason="unsubscribed")))
    assert [sub.receive(0).seq for _ in range(2)] == [0, 1]  # type: ignore[union-attr]
    assert (sub.receive(0), sub.receive(0), sub.dropped) == (Lagged(7), None, 3)
    assert sub.ended == "unsubscribed"


def test_unsubscribing_ends_the_stream_at_the_agent() -> None:
    with agent() as path, AgentClient(path) as client:
        with client.subscribe(TOPIC) as sub:
            client.publish(TOPIC, b"one")
            assert isinstance(sub.receive(WAIT), Delivery)
        assert client.inspect().stats["subscriptions"] == 0


def test_a_request_id_already_in_flight_is_refused() -> None:
    with agent() as path, AgentClient(path) as client, client.subscribe(TOPIC) as sub:
        rid = sub._rid  # a subscription stays in flight under its request's id
        with pytest.raises(AgentError, match=f"request id {rid} is already in flight"):
            client._call(rid=rid, inspect=pb.Inspect())


# -- without a socket -------------------------------------------------------------------------


def test_a_stamp_without_a_named_place_is_refused_before_anything_is_published() -> None:
    with agent() as path, AgentClient(path) as client:
        with pytest.raises(ValueError, match="named stream"):
            client.publish_batch(TOPIC, [Record(b"x", timestamp_ms=5)])
        bad = pb.Record(value=b"x", timestamp_ms=5)
        with pytest.raises(AgentError, match="timestamp_ms is for a named stream") as refused:
            client._call(publish_batch=pb.PublishBatch(topic=TOPIC, records=[bad]))
        assert isinstance(refused.value, AgentBadRequest) and client.offsets(TOPIC) == {}
        stamped = client.publish(TOPIC, b"row", stream=(b"s", 0), timestamp_ms=1234)
        assert client.read_range(TOPIC, b"s", 0, 0)[0].timestamp_ms == 1234
        assert not stamped.duplicate


def test_holdings_bounds_are_enforced_with_a_clear_error() -> None:
    with agent(max_holdings_nodes=2) as path, AgentClient(path) as client:
        with pytest.raises(AgentError, match="at most 2 nodes"):
            client.holdings(TOPIC, peers=[b"a", b"b"], addresses=["127.0.0.1:1"])
        with pytest.raises(AgentError, match="timeout must be in"):
            client.holdings(TOPIC, timeout=1e6)
        with pytest.raises(AgentError, match="a span: bad span"):
            body = pb.Holdings(topic=TOPIC, spans=[pb.Span(publisher=b"p", first_seq=3)])
            client._call(holdings=body)
        with pytest.raises(AgentError, match="at most 2 holders"):
            client.read_range(TOPIC, b"p", 0, 0, fetch_timeout=1, holders=[b"a", b"b", b"c"])
        # An unreachable address is reported, not an error: it is asked as any other node.
        (me, gone) = client.holdings(TOPIC, addresses=["127.0.0.1:1"], timeout=2)
        assert me.answered and me.node_id == client.inspect().node_id
        assert (gone.node_id, gone.address, gone.answered) == (b"", "127.0.0.1:1", False)


def test_keys_load_from_raw_or_hex_files_and_the_environment(tmp_path: Path) -> None:
    raw, hexed = tmp_path / "raw", tmp_path / "hex"
    raw.write_bytes(KEY)
    hexed.write_text(KEY.hex() + "\n")
    assert load_key(str(raw)) == load_key(str(hexed)) == KEY
    assert load_key(None, {"EPISUB_KEY": KEY.hex()}) == KEY
    with pytest.raises(UsageError, match="EPISUB_KEY must be 64 hex characters"):
        load_key(None, {"EPISUB_KEY": "zz" * 32})


def test_the_link_delay_file_maps_zones(tmp_path: Path) -> None:
    path = tmp_path / "zones.json"
    path.write_text('{"zones": {"127.0.0.1:7001": "a", "127.0.0.1:7002": "a"}, "inter_ms": 30}')
    delay = load_link_delay(str(path))
    assert delay is not None
    mine, mate, far = (b"127.0.0.1:%d/0123456789abcdef" % p for p in (7001, 7002, 7003))
    assert (delay(mine, mate), delay(mine, far)) == (0.0, 0.03)
    path.write_text('{"zones": {}, "inter_ms": -1}')
    with pytest.raises(UsageError, match="inter_ms must be a number >= 0, not -1"):
        load_link_delay(str(path))


def test_the_agent_s_receipt_is_the_node_s_and_the_old_name_warns() -> None:
    import episub
    import episub.agent

    assert episub.agent.Receipt is episub.Receipt is episub.node.Receipt
    with pytest.warns(DeprecationWarning, match=r"episub\.agent\.Published is deprecated"):
        old = episub.agent.Published  # type: ignore[attr-defined]
    assert old is episub.Receipt


def test_each_refusal_kind_the_agent_sends_is_its_own_class_and_still_an_agent_error():
    from episub.agent import errors

    for kind, cls in [
        ("bad_request", errors.AgentBadRequest),
        ("bootstrap", errors.AgentBootstrapFailed),
        ("timeout", errors.AgentWaitExpired),
        ("too_large", errors.AgentTooLarge),
        ("limit", errors.AgentAtLimit),
        ("internal", errors.AgentInternalError),
    ]:
        raised = errors.agent_error(kind, "why")
        assert type(raised) is cls and raised.kind == kind and str(raised) == "why"
        assert isinstance(raised, AgentError) and not isinstance(raised, errors.AgentTimeout)
    unknown = errors.agent_error("new_kind", "why")
    assert type(unknown) is AgentError and "new_kind" in str(unknown)


def test_an_inspect_that_fails_answers_its_error_and_the_connection_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`inspect` is answered in the task that reads the client's requests: an exception
    there (the TypeError that once answered every probe for minutes) becomes the request's
    Error reply, and the same connection's next requests are served."""
    real = AgentService.node_info
    failures = [TypeError("'<' not supported between instances of 'str' and 'bytes'")]

    def node_info(self: AgentService, extra: dict[str, int]) -> pb.NodeInfo:
        if failures:
            raise failures.pop()
        return real(self, extra)

    monkeypatch.setattr(AgentService, "node_info", node_info)
    with agent() as path, AgentClient(path) as client:
        with pytest.raises(AgentBadRequest, match="not supported between"):
            client.inspect()
        status = client.inspect()
        assert list(status.topics) == [TOPIC]
        assert status.stats["agent_request_errors"] == 1
        assert client.publish(TOPIC, b"after").seq == 0


@pytest.mark.parametrize(
    "item",
    [
        Lagged(0),
        Lost(b"", 0, 0),
        Delivery(
            topic="t", publisher=b"", seq=0, timestamp_ms=0, key=None, value=b"", headers=(), id=b""
        ),
        Delivery(
            topic="t",
            publisher=b"p",
            seq=7,
            timestamp_ms=1,
            key=b"k",
            value=b"v" * 1000,
            headers=(("h", b"x"),),
            id=b"i" * 32,
        ),
    ],
)
def test_a_subscription_item_written_into_its_reply_in_place_reads_back_as_itself(
    item: object,
) -> None:
    """The agent fills a reply's item in place (the value copied once): every kind comes
    back as it was, an item whose fields all hold defaults too (the oneof still says which)."""
    reply = pb.Response(id=1)
    item_to_pb(item, reply.item)  # type: ignore[arg-type]
    back = pb.Response.FromString(reply.SerializeToString())
    assert item_from_pb(back.item) == item
