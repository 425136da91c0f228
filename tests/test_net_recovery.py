"""A node left with no neighbour and no passive peer gets back in through its bootstrap
addresses (issue 13's recovery), over real sockets on 127.0.0.1.

The core asks its contacts and every peer it remembers, with backoff (membership.py); the
node (episub/node/bootstrap.py) dials the bootstrap addresses again at each attempt, because a
contact that restarted answers its address with a new peer id, which the core cannot
know: the old id is gone for good.
"""

from __future__ import annotations

import pytest
import trio

from episub import Node
from tests.net_helpers import KEY, TOPIC, WAIT, fast_config, run, wait_until

pytestmark = pytest.mark.timeout(120)


def test_a_node_whose_only_contact_restarted_dials_its_address_again_and_gets_back_in() -> None:
    async def main() -> None:
        async with Node(key=KEY, config=fast_config()) as c:
            async with Node(key=KEY, config=fast_config()) as b:
                address, old_id = b.address, b.id
                await b.join(TOPIC)
                await c.join(TOPIC, bootstrap=[address])
                await wait_until(lambda: c.neighbors(TOPIC), what="c linked to b")
            # b left (LEAVE) and is gone: c has no neighbour and no passive peer.
            await wait_until(lambda: not c.neighbors(TOPIC), what="c alone")
            async with Node(key=KEY, config=fast_config(), listen=address) as b2:
                assert b2.id != old_id  # a new incarnation at the same address
                await b2.join(TOPIC)
                await wait_until(
                    lambda: [n.peer_id for n in c.neighbors(TOPIC)] == [b2.id],
                    what="c linked to the restarted b",
                )
                # A link is up at one end before the other: b2 pushes only to its own
                # neighbours, so wait for its end too before publishing.
                await wait_until(
                    lambda: [n.peer_id for n in b2.neighbors(TOPIC)] == [c.id],
                    what="the restarted b linked to c",
                )
                async with c.subscribe(TOPIC) as sub:
                    await b2.publish(TOPIC, b"welcome back")
                    with trio.fail_after(WAIT):
                        item = await sub.receive()
                    assert item.value == b"welcome back"  # type: ignore[union-attr]
            assert c.stats()["recoveries"] >= 1

    run(main)
