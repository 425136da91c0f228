"""Nagle's rule for the application's bursts (connection.GATHER_WAIT), on real sockets: a
publish after a quiet spell of the application goes out at once, however lately the link
carried other traffic (messages relayed for other publishers, membership), and only the
publishes of a burst are held back to share a write.

GATHER_WAIT is raised to a minute here so that "recent" does not depend on the machine's
speed: whatever is held back stays in the peer's queue for the length of the test."""

from __future__ import annotations

import pytest

from episub import Node
from tests import hostile_peer
from tests.net_helpers import KEY, TOPIC, RawPeer, run
from tests.test_net_hostile import config
from tests.test_net_runtime import runtime_of

pytestmark = pytest.mark.timeout(60)


def test_a_publish_after_a_quiet_spell_is_written_at_once_and_a_burst_is_gathered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("episub.net.connection.GATHER_WAIT", 60.0)

    async def main() -> None:
        async with Node(key=KEY, config=config()) as a:
            await a.join(TOPIC)
            raw = await RawPeer.connect(a.address)
            # The node has just written to the link (its NEIGHBOR request): not a publish.
            await hostile_peer.join_as_neighbour(raw, TOPIC)
            peer = runtime_of(a).network.peers[raw.id]

            await a.publish(TOPIC, b"first")
            assert not peer.queue, "the first publish was held back behind other traffic"

            await a.publish(TOPIC, b"second")  # right after the first: a burst
            assert peer.queue, "the burst's second publish was not gathered"
            await raw.aclose()

    run(main)
