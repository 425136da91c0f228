"""A peer that holds the key and misbehaves on purpose (tests/hostile_peer.py): for each
behaviour, the node under attack stays within its limits and its honest peer still gets
every message, once and in order (assert_still_serving)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import trio

from episub import Delivery, Lost, Node, Subscription
from episub.agent import AgentClient, AgentStatus
from episub.agent.cli import format_status, status_json
from episub.agent.server import AgentServer
from episub.agent.service import AgentService
from episub.net.network import SEND_QUEUE_CAP
from episub.proto.config import BroadcastConfig
from episub.proto.messages import MAX_PUBLISHER_NAME, Envelope, GetHeld, History, Pull
from tests import hostile_peer
from tests.net_helpers import KEY, TOPIC, WAIT, RawPeer, run, wait_until
from tests.proc_helpers import socket_dir
from tests.test_net_hostile import assert_still_serving, honest_pair
from tests.test_net_hostile import config as honest_config

pytestmark = pytest.mark.timeout(120)


def broadcast_state(node: Node):  # type: ignore[no-untyped-def]
    """The core's broadcast machine of TOPIC on `node` (to check its tables' sizes)."""
    return node._running().state._topics[TOPIC].broadcast


def test_an_ihave_flood_of_unknown_ids_keeps_the_missing_table_bounded() -> None:
    async def main() -> None:
        async with honest_pair() as (a, b):
            raw = await RawPeer.connect(a.address)
            await hostile_peer.ihave_flood(raw, TOPIC, rounds=15)  # 14,880 places
            limit = BroadcastConfig().max_missing
            await wait_until(lambda: len(broadcast_state(a).missing) > 0, what="the flood")
            await assert_still_serving(a, b)
            assert len(broadcast_state(a).missing) <= limit
            await raw.aclose()

    run(main)


def test_grafting_everything_without_reading_keeps_its_answers_in_their_bounds() -> None:
    async def main() -> None:
        async with honest_pair() as (a, b), Node(key=KEY, config=honest_config()) as c:
            await c.join(TOPIC, bootstrap=[a.address])
            for i in range(200):  # something for a to answer grafts with (c's stream)
                await c.publish(TOPIC, b"x%d" % i + b"." * 600)
            await wait_until(lambda: broadcast_state(a).places.places() >= 200, what="a's store")
            raw = await RawPeer.connect(a.address, receive_buffer=4096)
            await hostile_peer.graft_all(raw, TOPIC, rounds=10, known=[c.id])  # never reads
            await assert_still_serving(a, b)
            # What waits for the grafter stays within its queue's bound (items and bytes):
            # its answers are encoded only as it reads, so its queue never overflows.
            stats = a.stats()
            assert stats["queued_messages"] <= SEND_QUEUE_CAP // 8 + 1
            assert stats["queue_overflows"] == 0

    run(main)


def test_pulls_repeated_without_reading_wait_merged_and_go_with_the_connection() -> None:
    """The PULL amplification sequence in one process: 48 messages of 100 KB, 100 PULLs of
    all of them, never read. A repeat merges with the PULL still being answered; only what
    the queue's fill mark allows is made, a batch at a time; closing the connection drops
    the rest."""

    async def main() -> None:
        async with honest_pair(max_message=100_000) as (a, b):
            raw = await RawPeer.connect(a.address, receive_buffer=4096)
            await hostile_peer.join_as_neighbour(raw, TOPIC)
            await publish_large(a, raw, 48)
            pull = (TOPIC, Pull(publisher=raw.id, first_seq=0, last_seq=47))
            for _ in range(10):
                await raw.send_items([pull] * 10)
            await wait_until(lambda: a.stats()["answer_ranges_merged"] >= 99, what="merged")
            stats = a.stats()
            # 4,800 answers asked: one PULL's worth is being answered, and only what the
            # socket and the queue's fill mark (an eighth of its bytes) took was made.
            assert stats["answer_askers"] == 1, stats
            assert stats["answers_waiting"] <= 48 and stats["answers_sent"] < 2 * 48, stats
            assert stats["queue_overflows"] == 0 and stats["answers_dropped"] == 0, stats
            await raw.aclose()
            await wait_until(
                lambda: a.stats()["answer_askers"] == a.stats()["answers_waiting"] == 0,
                what="answers dropped",
            )
            await assert_still_serving(a, b)
            # What the agent's `inspect` reads of the node answers after the attack (it
            # once answered a TypeError for minutes after it).
            service = AgentService(a)
            service._joined[TOPIC] = None
            info = service.node_info({})
            assert info.stats["answer_ranges_merged"] >= 99
            assert [t.topic for t in info.topics] == [TOPIC]

    run(main)


def test_the_agent_answers_inspect_through_its_socket_during_and_after_the_pull_sequence() -> None:
    """Issue 27, item 3: after the PULL sequence the target's agent answered every `inspect`
    with a TypeError ('<' between a str and another type) for 150 s. The sequence again,
    in one process (48 messages of 100 KB, plus messages under odd publisher ids: bytes
    that are not ASCII, the longest id, digits), against a node served by a real agent:
    `inspect` goes through the agent's socket and the blocking client, and the CLI's two
    renderings of it (both sort), while the PULLs' answers wait for a peer that does not
    read and after its connection went with them."""

    def inspected(path: str) -> AgentStatus:
        with AgentClient(path) as client:
            status = client.inspect()
        json.dumps(status_json(status), sort_keys=True)
        format_status(status, every_counter=True)
        return status

    async def main() -> None:
        directory = socket_dir()
        path = str(Path(directory) / "agent.sock")
        async with honest_pair(max_message=100_000) as (a, b), trio.open_nursery() as nursery:
            service = AgentService(a)
            service._joined[TOPIC] = None  # joined by honest_pair, not through the service
            await nursery.start(service.run)
            await nursery.start(AgentServer(service, path).run)
            raw = await RawPeer.connect(a.address, receive_buffer=4096)
            await hostile_peer.join_as_neighbour(raw, TOPIC)
            for seq in range(48):
                gossip = hostile_peer.forged_gossip(TOPIC, raw.id, seq, payload=b"x" * 100_000)
                await raw.send_items([(TOPIC, gossip)])
            odd = (bytes(range(128, 192)), b"p" * MAX_PUBLISHER_NAME, b"0", b"\x00")
            await raw.send_items([(TOPIC, hostile_peer.forged_gossip(TOPIC, p, 0)) for p in odd])
            await wait_until(lambda: a.stats()["retained_messages"] >= 52, what="52 held")
            pull = (TOPIC, Pull(publisher=raw.id, first_seq=0, last_seq=47))
            for _ in range(10):
                await raw.send_items([pull] * 10)
            await wait_until(lambda: a.stats()["answer_ranges_merged"] >= 99, what="merged")
            during = await trio.to_thread.run_sync(inspected, path)
            assert during.stats["answers_waiting"] > 0, during.stats
            assert raw.id in [n.peer_id for n in during.topics[TOPIC]]
            await raw.aclose()
            await wait_until(lambda: a.stats()["answers_waiting"] == 0, what="answers dropped")
            after = await trio.to_thread.run_sync(inspected, path)
            assert after.stats["answer_ranges_merged"] >= 99
            assert list(after.topics) == [TOPIC] and b.id in [
                n.peer_id for n in after.topics[TOPIC]
            ]
            assert after.stats["agent_request_errors"] == 0 and after.stats["core_errors"] == 0
            nursery.cancel_scope.cancel()
        shutil.rmtree(directory, ignore_errors=True)

    run(main)


def test_a_pull_larger_than_a_batch_is_answered_whole_to_a_peer_that_reads() -> None:
    """48 messages of 100 KB, one PULL of all of them: each batch (one message here, past
    answer_batch_bytes) is made as the lane of the last empties, until every one went."""

    async def main() -> None:
        async with honest_pair(max_message=100_000) as (a, _):
            raw = await RawPeer.connect(a.address)
            await hostile_peer.join_as_neighbour(raw, TOPIC)
            await publish_large(a, raw, 48)
            batches = a.stats()["answer_batches"]
            await raw.send_items([(TOPIC, Pull(publisher=raw.id, first_seq=0, last_seq=47))])
            got = await history_seqs(raw, 48)
            assert got == list(range(48))
            assert a.stats()["answer_batches"] - batches >= 48
            await raw.aclose()

    run(main)


def test_the_step_that_reads_a_pull_makes_none_of_its_answers() -> None:
    """Issue 27, acceptance 1's honest p99: the step that read 100 PULLs of 1 MB messages
    also encoded and sealed their first answers, and honest frames read in the same turn
    waited ~20 ms behind it. The step that hands a PULL to the core now only queues its
    answers: they are made and written in the network's answer task's later steps, and
    every one still reaches a peer that reads."""

    async def main() -> None:
        async with honest_pair(max_message=100_000) as (a, _):
            runtime = a._running()
            handed = runtime.network._on_frames
            made_in_read: list[int] = []

            def on_frames(conn, frames, resumed):  # type: ignore[no-untyped-def]
                before = a.stats()["answers_sent"]
                rest = handed(conn, frames, resumed)
                if any(isinstance(m, Pull) for frame in frames for _, m in frame):
                    made_in_read.append(a.stats()["answers_sent"] - before)
                return rest

            runtime.network._on_frames = on_frames  # connections made from here on use it
            raw = await RawPeer.connect(a.address)
            await hostile_peer.join_as_neighbour(raw, TOPIC)
            await publish_large(a, raw, 8)
            await raw.send_items([(TOPIC, Pull(publisher=raw.id, first_seq=0, last_seq=7))])
            got = await history_seqs(raw, 8)
            assert made_in_read == [0]
            assert got == list(range(8))
            await raw.aclose()

    run(main)


def test_a_join_with_a_huge_ttl_is_refused_by_the_decoder(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with honest_pair() as (a, b):
            raw = await RawPeer.connect(a.address)
            await hostile_peer.huge_ttl(raw, TOPIC)
            with trio.fail_after(WAIT):
                await raw.wait_closed()
            await assert_still_serving(a, b)

    with caplog.at_level(logging.WARNING):
        run(main)
    assert "ttl" in caplog.text.lower()


def test_replayed_gossip_is_never_delivered_twice() -> None:
    async def main() -> None:
        async with honest_pair() as (a, b):
            raw = await RawPeer.connect(b.address)
            async with a.subscribe(TOPIC) as at_a, trio.open_nursery() as nursery:

                async def publish_until_pushed() -> None:
                    for i in range(50):
                        await b.publish(TOPIC, b"pushed %d" % i)
                        await trio.sleep(0.05)

                nursery.start_soon(publish_until_pushed)
                with trio.fail_after(WAIT):
                    replayed = await hostile_peer.replay_gossip(raw, TOPIC, copies=100)
                seen = []
                with trio.fail_after(WAIT):
                    while len(seen) < 50:
                        seen.append((await at_a.receive()).seq)  # type: ignore[union-attr]
                assert seen == list(range(50))  # each once, in order, replays included
                assert replayed.envelope.publisher == b.id
            assert b.stats()["duplicates_received"] >= 100

    run(main)


def test_a_peer_stalled_mid_frame_holds_up_nobody() -> None:
    async def main() -> None:
        async with honest_pair() as (a, b):
            raw = await RawPeer.connect(a.address)
            await hostile_peer.stall_mid_frame(raw, TOPIC)
            await assert_still_serving(a, b)
            await raw.aclose()

    run(main)


def test_connections_in_a_loop_stop_at_max_connections(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with honest_pair(max_connections=8) as (a, b):
            peers = await hostile_peer.connect_loop(a.address, KEY, 30)
            await wait_until(lambda: a.stats()["connections_refused"] > 0, what="refusals")
            assert a.stats()["connections"] <= 8
            await assert_still_serving(a, b)
            for raw in peers:
                await raw.aclose()

    with caplog.at_level(logging.WARNING):
        run(main)
    assert "max_connections" in caplog.text


async def receive_from(sub: Subscription, publisher: bytes, count: int) -> list[Delivery]:
    """The next `count` messages of `publisher` on `sub`; a Lost of it fails the test."""
    got: list[Delivery] = []
    with trio.fail_after(WAIT):
        while len(got) < count:
            item = await sub.receive()
            if isinstance(item, Lost):
                assert item.publisher != publisher, f"reported lost: {item}"
            elif isinstance(item, Delivery) and item.publisher == publisher:
                got.append(item)
    return got


def test_a_forged_far_seq_under_a_real_publisher_does_not_silence_it() -> None:
    """Issue 13, item 3, with signing off: a forged GOSSIP under another node's publisher
    id at its seq + 5,000,000 made every subscriber report the range lost and then drop
    every later real message of that publisher (70 of 346 delivered)."""

    async def main() -> None:
        async with honest_pair() as (a, b), Node(key=KEY, config=honest_config()) as c:
            await c.join(TOPIC, bootstrap=[b.address])
            async with b.subscribe(TOPIC) as at_b, c.subscribe(TOPIC) as at_c:
                for i in range(10):
                    await a.publish(TOPIC, b"real %d" % i)
                for sub in (at_b, at_c):
                    await receive_from(sub, a.id, 10)
                raw = await RawPeer.connect(b.address)
                await hostile_peer.join_as_neighbour(raw, TOPIC)
                forged = hostile_peer.forged_gossip(TOPIC, a.id, 10 + 5_000_000)
                await raw.send_items([(TOPIC, forged)])
                await wait_until(lambda: forged.id in broadcast_state(b).seen, what="taken in")
                for i in range(10, 30):
                    await a.publish(TOPIC, b"real %d" % i)
                for sub in (at_b, at_c):
                    got = await receive_from(sub, a.id, 20)
                    expected = [(i, b"real %d" % i) for i in range(10, 30)]
                    assert [(m.seq, m.value) for m in got] == expected
            await raw.aclose()

    run(main)


def test_a_peer_asking_past_its_work_budget_is_refused_then_dropped() -> None:
    """GETHELDs of every publisher, 50 a frame, as fast as the socket takes them: past
    the burst they are refused, and once the peer owes a whole burst it is cut off."""

    async def main() -> None:
        async with honest_pair() as (a, b):
            raw = await RawPeer.connect(a.address)
            ask = [(TOPIC, GetHeld(nonce=i)) for i in range(50)]
            with trio.fail_after(WAIT):
                try:
                    for _ in range(200):
                        await raw.send_items(ask)
                except trio.BrokenResourceError:
                    pass  # cut off while still asking
                await raw.wait_closed()
            stats = a.stats()
            assert stats["peers_over_budget"] == 1 and stats["requests_throttled"] > 0, stats
            await assert_still_serving(a, b)

    run(main)


def test_a_read_full_of_requests_goes_to_the_core_a_steps_share_at_a_time() -> None:
    """Twenty GETHELDs in one frame cost twenty pages of work: the core is handed at most
    a step's share of them at once (runtime.STEP_REQUEST_WORK; before, all of a read in
    one step, however long), the rest after the reader let other tasks run, and every
    one is answered: the share defers requests, it refuses none."""
    from episub.net.runtime import STEP_REQUEST_WORK
    from episub.proto.messages import MAX_HELD_SPANS, Held

    asked = 20

    async def main() -> None:
        async with honest_pair() as (a, _):
            runtime = a._running()
            handed = runtime.network._on_frames
            per_step: list[int] = []

            def count(items) -> int:  # type: ignore[no-untyped-def]
                return sum(isinstance(m, GetHeld) for _, m in items)

            def on_frames(conn, frames, resumed):  # type: ignore[no-untyped-def]
                rest = handed(conn, frames, resumed)
                taken = sum(count(frame) for frame in frames) - (count(rest) if rest else 0)
                if taken:
                    per_step.append(taken)
                return rest

            runtime.network._on_frames = on_frames  # connections made from here on use it
            raw = await RawPeer.connect(a.address)
            await hostile_peer.join_as_neighbour(raw, TOPIC)
            await raw.send_items([(TOPIC, GetHeld(nonce=i)) for i in range(asked)])
            nonces: list[int] = []
            with trio.fail_after(WAIT):
                while len(nonces) < asked:
                    frame = await raw.reader.receive_frame()
                    assert frame is not None, "the target closed the connection"
                    nonces += [m.nonce for _, m in frame if isinstance(m, Held)]
            assert sorted(nonces) == list(range(asked))
            assert sum(per_step) == asked
            assert max(per_step) <= STEP_REQUEST_WORK // MAX_HELD_SPANS, per_step
            await raw.aclose()

    run(main)


def test_a_read_of_many_small_frames_is_decoded_a_steps_share_at_a_time() -> None:
    """4,000 PINGs in forty frames arrive in one read (one sealed record): decoding them
    all is ~100 ms of protobuf on one core, so the reader hands over at most
    DECODE_STEP_ITEMS of them (and the frame that passes it) per step, the rest after it
    let other tasks run (before, every frame of a read in one step); every PING is
    answered, in order."""
    from episub.net.connection import DECODE_STEP_ITEMS
    from episub.proto.messages import Ping, Pong
    from episub.proto.wire import encode_frame

    frames, per_frame = 40, 100

    async def main() -> None:
        async with honest_pair() as (a, _):
            runtime = a._running()
            handed = runtime.network._on_frames
            per_step: list[int] = []

            def on_frames(conn, got, resumed):  # type: ignore[no-untyped-def]
                pings = sum(isinstance(m, Ping) for frame in got for _, m in frame)
                if pings and not resumed:
                    per_step.append(pings)
                return handed(conn, got, resumed)

            runtime.network._on_frames = on_frames  # connections made from here on use it
            raw = await RawPeer.connect(a.address)
            await hostile_peer.join_as_neighbour(raw, TOPIC)
            data = b"".join(
                encode_frame([(TOPIC, Ping(nonce=f * per_frame + i)) for i in range(per_frame)])
                for f in range(frames)
            )
            await raw.send(data)  # one write: one sealed record, one read at the node
            nonces: list[int] = []
            with trio.fail_after(WAIT):
                while len(nonces) < frames * per_frame:
                    frame = await raw.reader.receive_frame()
                    assert frame is not None, "the target closed the connection"
                    nonces += [m.nonce for _, m in frame if isinstance(m, Pong)]
            assert nonces == list(range(frames * per_frame))
            assert sum(per_step) == frames * per_frame
            assert max(per_step) < DECODE_STEP_ITEMS + per_frame, per_step
            await raw.aclose()

    run(main)


async def publish_large(a: Node, raw: RawPeer, count: int) -> None:
    """`raw` publishes seqs 0..count-1 of 100 KB under its own id; `a` holds them all."""
    for seq in range(count):
        gossip = hostile_peer.forged_gossip(TOPIC, raw.id, seq, payload=b"x" * 100_000)
        await raw.send_items([(TOPIC, gossip)])
    await wait_until(lambda: a.stats()["retained_messages"] >= count, what=f"{count} held")


async def history_seqs(raw: RawPeer, count: int) -> list[int]:
    """The seqs of `raw`'s own messages in the HISTORY answers it reads, until `count`."""
    got: list[int] = []
    with trio.fail_after(WAIT):
        while len(got) < count:
            frame = await raw.reader.receive_frame()
            assert frame is not None, "the target closed the connection"
            for _, message in frame:
                if isinstance(message, History) and message.publisher == raw.id:
                    got += [Envelope.decode(e).seq for e in message.envelopes]
    return got
