"""Runtime rules on real sockets: dialling, duplicate connections, graceful closes,
idle connections, link-delay emulation.

Some tests hand the runtime outputs directly (`Runtime._carry_out`), as if the core had
produced them, to exercise one rule without building the protocol state that leads there.
"""

from __future__ import annotations

import logging
import random
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from episub import Node
from episub.net.connection import (
    KEEPALIVE_COUNT,
    KEEPALIVE_IDLE,
    KEEPALIVE_INTERVAL,
    RTO_MAX,
    TCP_RTO_MAX_MS,
    USER_TIMEOUT,
    Connection,
    Peer,
)
from episub.net.peer_id import make_peer_id, parse_address
from episub.net.runtime import SETTLED_UPKEEP, Runtime
from episub.proto.config import NodeConfig
from episub.proto.events import (
    AskTopics,
    ClosePeer,
    InEvent,
    OutEvent,
    ScheduleTimer,
    Send,
    ViewReport,
)
from episub.proto.messages import GetTopics, Ping, Prune, Topics, View
from tests.net_helpers import KEY, TOPIC, WAIT, RawPeer, fast_config, run, wait_until


def rto_max_supported() -> bool:
    """Whether this kernel takes TCP_RTO_MAX_MS (Linux 6.15+)."""
    with socket.socket() as probe:
        try:
            probe.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS, 1000)
        except OSError:
            return False
    return True


def runtime_of(node: Node) -> Runtime:
    assert node._runtime is not None
    return node._runtime


@asynccontextmanager
async def bare_runtime(**options: object) -> AsyncIterator[Runtime]:
    """A Runtime without the Node around it, for options the Node does not expose."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    events: list[OutEvent] = []
    runtime = Runtime(
        key=KEY,
        my_id=make_peer_id("127.0.0.1", port),
        config=NodeConfig(),
        rng=random.Random(1),
        on_events=events.extend,
        **options,  # type: ignore[arg-type]
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.run, listeners)
        try:
            yield runtime
        finally:
            await runtime.shutdown(1.0)


def test_two_peers_dialling_each_other_at_once_keep_the_connection_of_the_lower_id() -> None:
    async def main() -> None:
        async with Node(key=KEY) as a, Node(key=KEY) as b:
            ra, rb = runtime_of(a), runtime_of(b)
            # Neither has joined a topic: each answers the other's PING with a PONG and
            # nothing else, so exactly two messages reach each side.
            ra._carry_out([Send(b.id, "x", Ping(nonce=1))])
            rb._carry_out([Send(a.id, "x", Ping(nonce=2))])
            await wait_until(lambda: ra.counters.connections_opened == 2, what="a's 2 conns")
            await wait_until(lambda: rb.counters.connections_opened == 2, what="b's 2 conns")
            await wait_until(
                lambda: a.stats()["connections"] == 1 and b.stats()["connections"] == 1,
                what="one connection each",
            )
            kept_a, kept_b = ra.network.peers[b.id].conn, rb.network.peers[a.id].conn
            assert kept_a is not None and kept_b is not None
            assert kept_a.outbound == (a.id < b.id)
            assert kept_b.outbound == (b.id < a.id)
            await wait_until(lambda: a.stats()["messages_in"] == 2 == b.stats()["messages_in"])
            assert a.stats()["peers_lost"] == 0 == b.stats()["peers_lost"]

    run(main)


def test_close_peer_sends_what_is_queued_then_closes_quietly() -> None:
    async def main() -> None:
        async with Node(key=KEY) as a, Node(key=KEY) as b:
            # PRUNE on a topic b is not in: b takes it and answers nothing.
            runtime_of(a)._carry_out([Send(b.id, "x", Prune()), ClosePeer(b.id)])
            await wait_until(lambda: b.stats()["messages_in"] == 1, what="the PRUNE")
            await wait_until(
                lambda: a.stats()["connections"] == 0 == b.stats()["connections"],
                what="the close",
            )
            assert a.stats()["peers_lost"] == 0 == b.stats()["peers_lost"]

    run(main)


def test_a_failed_dial_is_connection_lost_and_drops_what_was_queued(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="episub.net")

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nobody = make_peer_id("127.0.0.1", listeners[0].socket.getsockname()[1])
        await listeners[0].aclose()
        async with Node(key=KEY) as a:
            ra = runtime_of(a)
            ra._carry_out([Send(nobody, "x", Prune()), Send(b"not an id", "x", Prune())])
            await wait_until(lambda: a.stats()["peers_lost"] == 2, what="two losses")
            assert a.stats()["dial_failures"] == 1  # the unparsable id is never dialled
            assert a.stats()["dropped_peer_lost"] == 2

    run(main)
    assert "dial to 127.0.0.1:" in caplog.text and "failed" in caplog.text
    assert "peer id must be 'host:port/tag'" in caplog.text


def test_an_id_at_our_own_address_is_a_former_incarnation_lost_without_a_dial(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A node restarted on its port under a new id still hears its old id from peers
    (passive views, shuffles) until it ages out; dialling it would reach our own
    listener and fail the handshake at both ends ("connected to ourselves")."""
    caplog.set_level(logging.INFO, logger="episub.net")

    async def main() -> None:
        async with Node(key=KEY) as a:
            own = parse_address(a.address)
            former = make_peer_id(own.host, own.port)  # same address, another tag
            assert former != a.id
            runtime_of(a)._carry_out([Send(former, "x", Prune())])
            await wait_until(lambda: a.stats()["peers_lost"] == 1, what="the loss")
            stats = a.stats()
            assert stats["dials"] == 0
            assert stats["connections_opened"] == 0
            assert stats["handshake_failures"] == 0
            assert stats["dropped_peer_lost"] == 1

    run(main)
    assert "a former incarnation of this node" in caplog.text


def test_a_connection_nobody_uses_closes_after_idle_timeout_quietly() -> None:
    async def main() -> None:
        async with bare_runtime(idle_timeout=0.2) as runtime, Node(key=KEY) as b:
            runtime_of(b)._carry_out([Send(runtime.me, "x", Prune())])
            await wait_until(lambda: runtime.counters.messages_in == 1, what="the PRUNE")
            await wait_until(
                lambda: runtime.stats()["connections"] == 0 == b.stats()["connections"],
                what="the idle close",
            )
            assert runtime.counters.peers_lost == 0 == b.stats()["peers_lost"]

    run(main)


def test_link_delay_holds_frames_back_and_keeps_their_order() -> None:
    async def main() -> None:
        jitter = random.Random(7)
        # A fresh delay per frame, 0-20 ms: later frames are often due before earlier ones.
        async with Node(key=KEY, link_delay=lambda me, peer: jitter.uniform(0, 0.02)) as a:
            raw = await RawPeer.connect(a.address)
            for nonce in range(200):  # one PING per frame: one PONG per frame back
                await raw.send_items([("x", Ping(nonce=nonce))])
            nonces = []
            with trio.fail_after(WAIT):
                while len(nonces) < 200:
                    frame = await raw.reader.receive_frame()
                    assert frame is not None
                    nonces += [message.nonce for _, message in frame]  # type: ignore[union-attr]
            assert nonces == list(range(200))
            await raw.aclose()

    run(main)


def test_link_delay_shows_in_the_measured_rtt() -> None:
    async def main() -> None:
        delay = 0.05
        config = fast_config()
        async with (
            Node(key=KEY, config=config, link_delay=lambda me, peer: delay) as a,
            Node(key=KEY, config=config) as b,
        ):
            await a.join(TOPIC)
            await b.join(TOPIC, bootstrap=[a.address])
            await wait_until(
                lambda: any(n.rtt_ms is not None for n in a.neighbors(TOPIC)), what="an RTT"
            )
            (neighbor,) = a.neighbors(TOPIC)
            assert neighbor.rtt_ms is not None and neighbor.rtt_ms >= delay * 1000

    run(main)


def test_a_command_given_while_the_core_is_fed_is_fed_after_it_never_inside_it() -> None:
    """The one pump: the node's dispatcher may give a command while the runtime carries
    out an input's outputs (as it answers a peer); the core is never re-entered, the
    command is fed once the input is done, and what it sends goes out."""

    async def main() -> None:
        async with Node(key=KEY) as node:
            runtime = runtime_of(node)
            raw = await RawPeer.connect(node.address)
            inside = False
            fed: list[str] = []
            handle, handle_received = runtime.state.handle, runtime.state.handle_received

            def watched(event: InEvent, now: float, out: list[OutEvent] | None = None) -> object:
                nonlocal inside
                assert not inside, "the core was re-entered"
                inside = True
                try:
                    return handle(event, now, out)
                finally:
                    inside = False
                    fed.append(type(event).__name__)

            def watched_read(peer: bytes, items: object, now: float, out: object) -> object:
                nonlocal inside  # the core's way in for a read (ReceivedMany)
                assert not inside, "the core was re-entered"
                inside = True
                try:
                    return handle_received(peer, items, now, out)  # type: ignore[arg-type]
                finally:
                    inside = False
                    fed.append("ReceivedMany")

            def on_events(events: list[object]) -> None:
                if any(isinstance(e, ViewReport) for e in events):
                    runtime.input(AskTopics(raw.id))  # from inside the dispatcher

            runtime.state.handle = watched  # type: ignore[method-assign]
            runtime.state.handle_received = watched_read  # type: ignore[method-assign]
            runtime._on_events = on_events
            await raw.send_items([("x", View(entries=(), passive_count=0))])
            frame = await raw.reader.receive_frame()
            assert frame is not None and isinstance(frame[0][1], GetTopics)
            assert [kind for kind in fed if kind != "RttMeasured"] == ["ReceivedMany", "AskTopics"]
            await raw.aclose()

    run(main)


def test_a_timer_that_may_fire_early_fires_while_the_node_handles_a_frame() -> None:
    """ScheduleTimer.early (the IHAVE flush): once inside its early window, the timer fires
    in the wakeup of the next frame the node reads, not in a wakeup of its own; before
    the window it waits, and a timer fired early is gone from the queue."""

    async def main() -> None:
        async with Node(key=KEY) as node:
            runtime = runtime_of(node)
            fired: list[object] = []
            feed = runtime._feed

            def recording(event: InEvent, now: float, command: bool) -> Exception | None:
                token = getattr(event, "token", None)
                if token in ("ripe", "green"):  # ours, not the core's
                    fired.append(token)
                    return None
                return feed(event, now, command)

            runtime._feed = recording  # type: ignore[method-assign]
            runtime._carry_out([ScheduleTimer(3600.0, "ripe", early=3600.0)])  # fires at once
            runtime._carry_out([ScheduleTimer(3600.0, "green", early=1.0)])  # not for an hour
            raw = await RawPeer.connect(node.address)
            await raw.send_items([(None, GetTopics())])
            frame = await raw.reader.receive_frame()  # the answer: the frame was handled
            assert frame is not None and isinstance(frame[0][1], Topics)
            assert fired == ["ripe"]
            tokens = runtime._timers.tokens()
            assert "ripe" not in tokens and "green" in tokens
            await raw.aclose()

    run(main)


def test_every_connection_has_kernel_keepalive_capped_retransmission_waits_and_kernel_rtt() -> None:
    async def main() -> None:
        # No PING over the link in the test's time: any RTT must be the kernel's.
        config = fast_config(ping_interval=1000.0)
        async with Node(key=KEY, config=config) as a, Node(key=KEY, config=config) as b:
            assert runtime_of(a).state.config.membership.pong_rtt is False
            await a.join(TOPIC)
            await b.join(TOPIC, bootstrap=[a.address])
            await wait_until(
                lambda: any(n.rtt_ms is not None for n in b.neighbors(TOPIC)), what="an RTT"
            )
            (neighbor,) = b.neighbors(TOPIC)
            assert neighbor.rtt_ms is not None and neighbor.rtt_ms > 0
            for node in (a, b):
                for peer in runtime_of(node).network.peers.values():
                    assert peer.conn is not None
                    sock = peer.conn.stream.socket
                    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                    if sys.platform == "linux":
                        tcp = socket.IPPROTO_TCP
                        assert sock.getsockopt(tcp, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE
                        assert sock.getsockopt(tcp, socket.TCP_KEEPINTVL) == KEEPALIVE_INTERVAL
                        assert sock.getsockopt(tcp, socket.TCP_KEEPCNT) == KEEPALIVE_COUNT
                        timeout_ms = sock.getsockopt(tcp, socket.TCP_USER_TIMEOUT)
                        assert timeout_ms == USER_TIMEOUT * 1000
                        if rto_max_supported():
                            assert sock.getsockopt(tcp, TCP_RTO_MAX_MS) == RTO_MAX * 1000

    run(main)


def test_under_link_delay_rtt_comes_from_pongs_and_the_runtime_leaves_set_choices() -> None:
    async def main() -> None:
        async with Node(key=KEY, link_delay=lambda me, peer: 0.0) as a:
            assert runtime_of(a).state.config.membership.pong_rtt is True
            assert runtime_of(a).state.config.membership.settled_upkeep == SETTLED_UPKEEP
        config = fast_config(settled_upkeep=1.0, pong_rtt=True)
        async with Node(key=KEY, config=config) as b:
            membership = runtime_of(b).state.config.membership
            assert (membership.settled_upkeep, membership.pong_rtt) == (1.0, True)

    run(main)


def test_a_connection_whose_write_failed_seals_nothing_more() -> None:
    """A peer that asks for 1 MB answers and closes at once: the write that fails aborts
    the connection, and nothing more of its queue is sealed (the writer once took, sealed
    and failed to write the whole queue, ~10 ms of a step, before it noticed). Our own
    end shut for writing stands for the reset: it fails every write at once."""

    async def main() -> None:
        listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
        port = listener.socket.getsockname()[1]
        client = await trio.open_tcp_stream("127.0.0.1", port)
        server = await listener.accept()
        conn = Connection(
            stream=client,
            peer=Peer(b"asker"),
            outbound=True,
            session_key=bytes(32),
            trailing_data=b"",
            max_frame_size=2_000_000,
            delay=None,
            on_frames=lambda conn, frames, resumed: None,
            on_written=lambda conn, count, size: None,
        )
        conn.peer.conn = conn
        sealer = conn._sealer
        assert sealer is not None
        sealed: list[int] = []

        class CountingSealer:
            def seal(self, data: bytes) -> bytes:
                sealed.append(len(data))
                return sealer.seal(data)

        conn._sealer = CountingSealer()  # type: ignore[assignment]
        client.socket.shutdown(socket.SHUT_WR)  # every write fails now (EPIPE), as to a reset
        conn.peer.queue.extend(b"x" * 1_000_000 for _ in range(8))
        conn.flush()  # this write fails, and the connection is aborted
        assert conn.aborted and conn.failure is not None
        assert len(sealed) == 1
        conn.flush()  # as the write loop, going round while the queue holds anything
        assert len(sealed) == 1 and len(conn.peer.queue) > 0
        await client.aclose()
        await server.aclose()
        await listener.aclose()

    run(main)
