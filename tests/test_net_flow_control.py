"""Publish flow control on real sockets: a burst waits for a slow but live neighbour
(network.wait_for_room) instead of overflowing its send queue and losing the link; a
neighbour that stops reading altogether is still dropped, so it cannot stall a publisher."""

from __future__ import annotations

import pytest
import trio

from episub import Node
from episub.net.network import SEND_QUEUE_CAP
from episub.proto.messages import Gossip
from tests import hostile_peer
from tests.net_helpers import KEY, TOPIC, RawPeer, run, wait_until
from tests.test_net_hostile import config

pytestmark = pytest.mark.timeout(120)

# More messages than a send queue holds: without flow control the burst overflows it.
BURST = 2 * SEND_QUEUE_CAP
# And more bytes than the kernel's socket buffers take (Linux autotunes a TCP send buffer
# up to 4 MiB): the node writes a burst in big writes, so small messages would all fit there
# and never wait in the queue at all. 8,192 x 900 B is 7.4 MB.
FILLER = b"x" * 900


async def read_slowly(raw: RawPeer, want: int, got: list[int], node: Node) -> None:
    """Count GOSSIPs as they come, a frame at a time, pausing after each: a live reader
    that is slower than the publisher. It starts reading only once a publish has waited
    for room: how far a reader keeps up on its own depends on the machine's load (the node
    packs a burst into few frames), and this test is about what happens when it does not."""
    await wait_until(lambda: node.stats()["publish_waits"] > 0, what="a publish waited")
    while got[0] < want:
        frame = await raw.reader.receive_frame()
        if frame is None:
            return
        got[0] += sum(isinstance(message, Gossip) for _, message in frame)
        await trio.sleep(0.002)  # the reader's pace, not a synchronisation


def test_a_burst_waits_for_a_slow_live_neighbour_instead_of_dropping_it() -> None:
    async def main() -> None:
        async with Node(key=KEY, config=config()) as a:
            await a.join(TOPIC)
            raw = await RawPeer.connect(a.address, receive_buffer=4096)
            await hostile_peer.join_as_neighbour(raw, TOPIC)
            got = [0]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_slowly, raw, BURST, got, a)
                for i in range(BURST):
                    await a.publish(TOPIC, b"%d." % i + FILLER)
                await wait_until(lambda: got[0] == BURST, what="every message read")
            stats = a.stats()
            assert stats["queue_overflows"] == 0
            assert stats["publish_waits"] > 0
            assert raw.id in [n.peer_id for n in a.neighbors(TOPIC)]
            await raw.aclose()

    run(main)


def test_a_neighbour_that_stops_reading_is_dropped_after_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("episub.node.publishing.PUBLISH_WAIT", 0.5)

    async def main() -> None:
        async with Node(key=KEY, config=config()) as a:
            await a.join(TOPIC)
            raw = await RawPeer.connect(a.address, receive_buffer=4096)
            await hostile_peer.join_as_neighbour(raw, TOPIC)  # then never reads again
            for i in range(BURST):
                await a.publish(TOPIC, b"%d." % i + b"x" * 64)
            stats = a.stats()
            assert stats["queue_overflows"] == 1
            assert stats["publish_waits"] >= 1
            await wait_until(
                lambda: raw.id not in [n.peer_id for n in a.neighbors(TOPIC)],
                what="the stuck neighbour dropped",
            )
            await raw.aclose()

    run(main)
