"""The public async API on real sockets: publish, subscribe, join, neighbours, retention."""

from __future__ import annotations

import logging
import time
from contextlib import AsyncExitStack

import pytest
import trio

from episub import (
    BootstrapError,
    BroadcastConfig,
    Delivery,
    Lagged,
    LocalProtocolError,
    MessageTooLarge,
    Node,
    NodeConfig,
)
from episub.net.peer_id import parse_peer_id
from episub.proto.events import Send
from episub.proto.messages import Ping
from tests.net_helpers import KEY, OTHER_KEY, TOPIC, fast_config, run, wait_until


async def receive_messages(sub: object, count: int) -> list[Delivery]:
    out = []
    for _ in range(count):
        item = await sub.receive()  # type: ignore[attr-defined]
        assert isinstance(item, Delivery), item
        out.append(item)
    return out


async def pair(stack: AsyncExitStack, config: NodeConfig | None = None) -> tuple[Node, Node]:
    """Two nodes in one topic, each with the other as neighbour."""
    config = config or fast_config()
    a = await stack.enter_async_context(Node(key=KEY, config=config))
    b = await stack.enter_async_context(Node(key=KEY, config=config))
    await a.join(TOPIC)
    await b.join(TOPIC, bootstrap=[a.address])
    await wait_until(lambda: a.neighbors(TOPIC) and b.neighbors(TOPIC), what="a link")
    return a, b


def test_own_publishes_reach_own_subscribers_with_every_field() -> None:
    async def main() -> None:
        async with Node(key=KEY) as node:
            await node.join(TOPIC)
            async with node.subscribe(TOPIC) as sub:
                ids = [
                    await node.publish(TOPIC, b"v0"),
                    await node.publish(TOPIC, b"v1", key=b"k", headers={"h": b"x"}),
                ]
                first, second = await receive_messages(sub, 2)
        assert (first.seq, first.value, first.key, first.headers) == (0, b"v0", None, ())
        assert (second.seq, second.key, second.headers) == (1, b"k", (("h", b"x"),))
        assert [first.id, second.id] == ids
        assert first.publisher == second.publisher and first.topic == TOPIC
        # Stamped by the publisher's clock in Unix milliseconds (not trio's clock).
        assert abs(first.timestamp_ms / 1000 - time.time()) < 3600

    run(main)


def test_a_slow_subscriber_gets_lagged_where_items_went_missing() -> None:
    async def main() -> None:
        async with Node(key=KEY) as node:
            await node.join(TOPIC)
            async with node.subscribe(TOPIC, buffer=2) as sub:
                for i in range(10):
                    await node.publish(TOPIC, b"%d" % i)  # never blocks on the subscriber
                assert [m.seq for m in await receive_messages(sub, 2)] == [0, 1]
                assert await sub.receive() == Lagged(8)
                await node.publish(TOPIC, b"10")
                assert [m.seq for m in await receive_messages(sub, 1)] == [10]
                assert node.stats()["subscriber_dropped"] == 8

    run(main)


def test_receive_batch_takes_everything_buffered_in_one_call_in_order() -> None:
    async def main() -> None:
        async with Node(key=KEY) as node:
            await node.join(TOPIC)
            async with node.subscribe(TOPIC, buffer=4) as sub:
                for i in range(6):
                    await node.publish(TOPIC, b"%d" % i)
                batch = await sub.receive_batch()
                assert [item.seq for item in batch[:4]] == [0, 1, 2, 3]  # type: ignore[union-attr]
                assert batch[4:] == [Lagged(2)]
                await node.publish(TOPIC, b"6")
                await node.publish(TOPIC, b"7")
                assert [m.seq for m in await sub.receive_batch(max_items=1)] == [6]  # type: ignore[union-attr]
                assert [m.seq for m in await sub.receive_batch()] == [7]  # type: ignore[union-attr]

    run(main)


def test_lagged_comes_before_the_next_message_after_the_gap() -> None:
    async def main() -> None:
        async with Node(key=KEY) as node:
            await node.join(TOPIC)
            async with node.subscribe(TOPIC, buffer=1) as sub:
                for i in range(3):
                    await node.publish(TOPIC, b"%d" % i)  # 0 kept, 1 and 2 dropped
                assert [m.seq for m in await receive_messages(sub, 1)] == [0]
                await node.publish(TOPIC, b"3")
                assert await sub.receive() == Lagged(2)
                assert [m.seq for m in await receive_messages(sub, 1)] == [3]

    run(main)


def test_a_listener_sees_each_message_as_delivered_and_a_failing_one_is_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await pair(stack)
            heard: list[bytes] = []

            def broken(item: object) -> None:
                raise RuntimeError("listener bug")

            with (
                b.deliver_to(TOPIC, lambda item: heard.append(item.value)),
                b.deliver_to(TOPIC, broken),
            ):
                async with b.subscribe(TOPIC) as sub:
                    for i in range(3):
                        await a.publish(TOPIC, b"%d" % i)
                    await receive_messages(sub, 3)  # b delivered all three
                # Called during delivery, before the subscriber could run: all three heard.
                assert heard == [b"0", b"1", b"2"]
                assert b.stats()["listeners"] == 2
                assert b.stats()["listener_errors"] == 3  # and the node carried on
            await a.publish(TOPIC, b"after")
            async with b.subscribe(TOPIC) as sub:
                await a.publish(TOPIC, b"after2")
                await receive_messages(sub, 1)
            assert heard == [b"0", b"1", b"2"]  # out of the block: not called any more
            assert b.stats()["listeners"] == 0

    with caplog.at_level(logging.ERROR, logger="episub.node"):
        run(main)
    assert "listener bug" in caplog.text


def test_subscriptions_end_when_the_node_closes() -> None:
    async def main() -> None:
        items = []
        async with Node(key=KEY) as node:
            await node.join(TOPIC)
            sub = node.subscribe(TOPIC)
            await sub.__aenter__()
            await node.publish(TOPIC, b"last")
        async for item in sub:  # what was buffered, then the end
            items.append(item)
        assert [m.value for m in items] == [b"last"]  # type: ignore[union-attr]

    run(main)


def test_a_message_over_max_message_size_raises_message_too_large() -> None:
    async def main() -> None:
        config = NodeConfig(broadcast=BroadcastConfig(max_message_size=100))
        async with Node(key=KEY, config=config) as node:
            await node.join(TOPIC)
            with pytest.raises(MessageTooLarge, match=r"101 bytes exceeds max_message_size \(100"):
                await node.publish(TOPIC, b"x" * 101)
            await node.publish(TOPIC, b"x" * 100)

    run(main)


def test_join_fails_with_every_bootstrap_failure_when_none_answers() -> None:
    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        closed_port = listeners[0].socket.getsockname()[1]
        await listeners[0].aclose()
        refused = f"127.0.0.1:{closed_port}"
        async with Node(key=OTHER_KEY) as stranger, Node(key=KEY) as node:
            await stranger.join(TOPIC)
            with pytest.raises(BootstrapError) as caught:
                await node.join(TOPIC, bootstrap=[refused, stranger.address])
            assert set(caught.value.failures) == {refused, stranger.address}
            assert "deployment key" in str(caught.value.failures[stranger.address])
            assert refused in str(caught.value)
            assert TOPIC not in node.stats() or node.stats()["topics"] == 0

    run(main)


def test_a_node_with_another_key_cannot_join_publish_or_receive(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="episub.net")

    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await pair(stack)
            mallory = await stack.enter_async_context(Node(key=OTHER_KEY, config=fast_config()))
            with pytest.raises(BootstrapError):
                await mallory.join(TOPIC, bootstrap=[a.address, b.address])
            await mallory.join(TOPIC)  # alone, then publishing into the void
            async with b.subscribe(TOPIC) as sub, mallory.subscribe(TOPIC) as msub:
                await mallory.publish(TOPIC, b"forged")
                await a.publish(TOPIC, b"honest")
                assert [m.value for m in await receive_messages(sub, 1)] == [b"honest"]
                assert [m.value for m in await receive_messages(msub, 1)] == [b"forged"]
            assert mallory.stats()["gossip_received"] == 0
            assert mallory.stats()["connections"] == 0
            assert a.stats()["handshake_failures"] + b.stats()["handshake_failures"] >= 1
            assert b.stats()["gossip_received"] == 1

    run(main)
    assert "failed to prove the deployment key" in caplog.text


def test_join_skips_the_nodes_own_address() -> None:
    async def main() -> None:
        async with Node(key=KEY) as node:
            await node.join(TOPIC, bootstrap=[node.address])
            assert node.stats()["topics"] == 1

    run(main)


def test_misuse_raises_with_the_bad_value() -> None:
    async def main() -> None:
        async with Node(key=KEY) as node:
            with pytest.raises(LocalProtocolError, match="not joined to topic 't'"):
                await node.publish(TOPIC, b"x")
            await node.join(TOPIC)
            with pytest.raises(LocalProtocolError, match="already joined topic 't'"):
                await node.join(TOPIC)
            with pytest.raises(TypeError, match="list of 'host:port' strings"):
                await node.join("u", bootstrap="127.0.0.1:1")
            with pytest.raises(
                TypeError, match=r"value must be bytes, not str \(encode it first\)"
            ):
                await node.publish(TOPIC, "text")  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="buffer must be an int >= 1, not 0"):
                node.subscribe(TOPIC, buffer=0)
            with pytest.raises(LocalProtocolError, match="until entered"):
                await node.subscribe(TOPIC).receive()
        with pytest.raises(LocalProtocolError, match="not running"):
            node.id  # noqa: B018

    run(main)
    with pytest.raises(ValueError, match="key must be 32 bytes"):
        Node(key=b"short")
    with pytest.raises(ValueError, match="needs advertise="):
        Node(key=KEY, listen="0.0.0.0:0")


def test_an_exception_in_the_body_comes_out_as_raised() -> None:
    async def main() -> None:
        with pytest.raises(KeyError, match="boom"):
            async with Node(key=KEY) as node:
                await node.join(TOPIC)
                raise KeyError("boom")

    run(main)


def test_neighbors_show_addresses_kinds_roles_and_rtts_after_pings() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            nodes = list(await pair(stack))
            c = await stack.enter_async_context(Node(key=KEY, config=fast_config()))
            await c.join(TOPIC, bootstrap=[nodes[0].address])
            nodes.append(c)
            await wait_until(
                lambda: all(
                    n.neighbors(TOPIC) and all(x.rtt_ms is not None for x in n.neighbors(TOPIC))
                    for n in nodes
                ),
                what="RTTs to every neighbour",
            )
            for node in nodes:
                for neighbor in node.neighbors(TOPIC):
                    assert neighbor.address == str(parse_peer_id(neighbor.peer_id))
                    assert neighbor.kind in ("rand", "near")
                    assert neighbor.role in ("eager", "lazy")
                    assert neighbor.rtt_ms is not None and neighbor.rtt_ms > 0

    run(main)


def test_link_change_is_set_when_a_neighbour_comes_and_when_it_goes() -> None:
    async def main() -> None:
        async with Node(key=KEY, config=fast_config()) as a:
            await a.join(TOPIC)
            came = a.link_change(TOPIC)
            assert a.link_change(TOPIC) is came and not came.is_set()  # one until a change
            async with Node(key=KEY, config=fast_config()) as b:
                await b.join(TOPIC, bootstrap=[a.address])
                with trio.fail_after(10):
                    await came.wait()
                went = a.link_change(TOPIC)
                assert went is not came and not went.is_set()
                assert [n.peer_id for n in a.neighbors(TOPIC)] == [b.id]
            with trio.fail_after(10):
                await went.wait()  # b said goodbye as it closed
            assert a.neighbors(TOPIC) == []

    run(main)


def test_retained_serves_delivered_and_own_messages_by_range() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await pair(stack)
            async with b.subscribe(TOPIC) as sub:
                for i in range(5):
                    await a.publish(TOPIC, b"%d" % i)
                await receive_messages(sub, 5)
            for node in (a, b):
                assert [m.value for m in node.retained(TOPIC, a.id, 1, 3)] == [b"1", b"2", b"3"]
            assert b.retained(TOPIC, b.id, 0, 9) == []
            assert b.stats()["retained_messages"] == 5

    run(main)


def test_leaving_on_exit_is_a_goodbye_not_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="episub.net")

    async def main() -> None:
        async with Node(key=KEY, config=fast_config()) as a:
            async with Node(key=KEY, config=fast_config()) as b:
                await a.join(TOPIC)
                await b.join(TOPIC, bootstrap=[a.address])
                await wait_until(lambda: a.neighbors(TOPIC) and b.neighbors(TOPIC))
            await wait_until(lambda: not a.neighbors(TOPIC), what="a to drop b")
            await wait_until(lambda: a.stats()["connections"] == 0, what="the connection closed")
            assert a.stats()["peers_lost"] == 0  # b said LEAVE before closing: nothing lost

    run(main)
    assert "lost" not in caplog.text


def test_a_node_cancelled_from_outside_still_says_goodbye() -> None:
    async def main() -> None:
        async with Node(key=KEY, config=fast_config()) as a:
            await a.join(TOPIC)
            with trio.CancelScope() as outer:
                async with Node(key=KEY, config=fast_config()) as b:
                    await b.join(TOPIC, bootstrap=[a.address])
                    await wait_until(lambda: a.neighbors(TOPIC) and b.neighbors(TOPIC))
                    outer.cancel()
                    await trio.sleep_forever()
            await wait_until(lambda: not a.neighbors(TOPIC), what="a to drop b")
            assert a.stats()["peers_lost"] == 0  # LEAVE went out despite the cancellation

    run(main)


def test_a_restarted_peer_answering_under_a_new_id_replaces_the_old_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="episub.net")

    async def main() -> None:
        async with Node(key=KEY) as a:
            async with Node(key=KEY) as old:
                old_id, address = old.id, old.address
            async with Node(key=KEY, listen=address) as new:
                # The core asks for a peer it still knows by its old id (a stale passive
                # entry, say); the runtime dials the address in that id.
                runtime = a._runtime
                assert runtime is not None
                runtime._carry_out([Send(old_id, TOPIC, Ping(nonce=1))])
                await wait_until(lambda: new.id in runtime.connected_peers(), what="new id")
                assert old_id not in runtime.connected_peers()
                assert runtime.counters.peers_lost == 1  # ConnectionLost(old id) to the core

    run(main)
    assert "(restarted?)" in caplog.text


def test_join_returns_once_a_neighbour_is_up_so_a_publish_right_after_it_arrives():
    # The README's first example: publish straight after join, nothing else in between.
    async def main() -> Delivery:
        async with Node(key=KEY) as a, Node(key=KEY) as b:
            await a.join(TOPIC)
            await b.join(TOPIC, bootstrap=[a.address])
            assert b.neighbors(TOPIC)
            async with b.subscribe(TOPIC) as sub:
                await a.publish(TOPIC, b"hello")
                with trio.fail_after(30):  # bounds a broken build, not a speed claim
                    return (await receive_messages(sub, 1))[0]

    message = run(main)
    assert (message.seq, message.value) == (0, b"hello")


def test_join_with_no_neighbour_in_time_raises_timeout_error_and_stays_joined():
    async def main() -> None:
        async with Node(key=KEY) as a, Node(key=KEY) as b:
            # `a` never joins the topic: it answers, but no link can form.
            with pytest.raises(TimeoutError, match="no neighbour came within"):
                await b.join(TOPIC, bootstrap=[a.address], timeout=0.5)
            await b.leave(TOPIC)  # still joined, so leaving works

    run(main)


def test_publish_record_reports_the_place_and_a_named_place_is_published_once() -> None:
    """A retried writer on another node re-publishes a named place: nobody gets it twice."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await pair(stack)
            async with b.subscribe(TOPIC) as sub:
                own = await a.publish_record(TOPIC, b"own")
                assert (own.publisher, own.seq, own.duplicate) == (a.id, 0, False)
                assert [m.id for m in await receive_messages(sub, 1)] == [own.id]
                rows = [(b"row0", 0), (b"row1", 1)]
                receipts = [
                    await a.publish_record(TOPIC, v, stream=(b"sink/q/7/0", s)) for v, s in rows
                ]
                assert [r.duplicate for r in receipts] == [False, False]
                first = await receive_messages(sub, 2)
                # The retry runs on b, which has the first attempt's rows already.
                retried = [
                    await b.publish_record(TOPIC, v + b"'", stream=(b"sink/q/7/0", s))
                    for v, s in [*rows, (b"row2", 2)]
                ]
                assert [r.duplicate for r in retried] == [True, True, False]
                assert [r.id for r in retried[:2]] == [r.id for r in receipts]
                (third,) = await receive_messages(sub, 1)
            got = [(m.publisher, m.seq, m.value) for m in [*first, third]]
            assert got == [
                (b"sink/q/7/0", 0, b"row0"),
                (b"sink/q/7/0", 1, b"row1"),
                (b"sink/q/7/0", 2, b"row2'"),
            ]
            with pytest.raises(ValueError, match="own stream"):
                await a.publish_record(TOPIC, b"x", stream=(a.id, 5))
            with pytest.raises(ValueError, match=r"1\.\.64 bytes"):
                await a.publish_record(TOPIC, b"x", stream=(b"s" * 65, 0))

    run(main)


def test_a_late_joiner_fetches_history_from_neighbours_without_delivering_it_again() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await pair(stack)
            ids = [await a.publish(TOPIC, b"old%d" % i) for i in range(5)]
            await wait_until(lambda: len(b.retained(TOPIC, a.id, 0, 4)) == 5, what="b has all")
            late = await stack.enter_async_context(Node(key=KEY, config=fast_config()))
            await late.join(TOPIC, bootstrap=[b.address])
            async with late.subscribe(TOPIC) as sub:
                new_id = await a.publish(TOPIC, b"new")
                (first,) = await receive_messages(sub, 1)
                assert first.id == new_id
                # The stream, first seen after the join, looked one back to see where it
                # starts (ordering.py): seq 4, from before the join, is history, kept.
                assert [m.seq for m in late.retained(TOPIC, a.id, 0, 4)] == [4]
                got = await late.fetch(TOPIC, a.id, 0, 5)
                assert [m.id for m in got] == [*ids, new_id]
                # History is not news: the next item the subscriber gets is the next message.
                marker = await a.publish(TOPIC, b"marker")
                assert [m.id for m in await receive_messages(sub, 1)] == [marker]
            assert late.stats()["recovered"] == 5

    run(main)


def test_a_fetch_larger_than_a_send_queue_comes_in_chunks_without_losing_the_link() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, _ = await pair(stack)
            count = 6000  # above SEND_QUEUE_CAP: asked at once, the answers would overflow it
            for i in range(count):
                await a.publish(TOPIC, b"%d" % i)
            late = await stack.enter_async_context(Node(key=KEY, config=fast_config()))
            await late.join(TOPIC, bootstrap=[a.address])
            got = await late.fetch(TOPIC, a.id, 0, count - 1, timeout=60)
            assert [m.seq for m in got] == list(range(count))
            assert a.stats()["queue_overflows"] == 0

    run(main)


def test_the_old_name_message_imports_as_delivery_with_a_deprecation_warning() -> None:
    import episub

    with pytest.warns(
        DeprecationWarning, match=r"episub\.Message is deprecated: use episub\.Delivery"
    ):
        old = episub.Message  # type: ignore[attr-defined]
    assert old is episub.Delivery
    with pytest.raises(AttributeError, match="no attribute 'Mesage'"):
        episub.Mesage  # type: ignore[attr-defined]  # noqa: B018


def test_the_old_name_listen_still_calls_back_with_a_deprecation_warning() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            a, b = await pair(stack)
            heard: list[bytes] = []
            with pytest.warns(DeprecationWarning, match=r"use Node\.deliver_to"):
                old = b.listen(TOPIC, lambda item: heard.append(item.value))
            with old:
                async with b.subscribe(TOPIC) as sub:
                    await a.publish(TOPIC, b"x")
                    await receive_messages(sub, 1)
            assert heard == [b"x"]

    run(main)
