"""Containment, the second line behind the core's own checks (issue 13): an exception out
of the core on any path (a frame, a timer, a command) never ends the node. It is counted
(`core_errors`), logged at most once a minute per kind, the peer whose frame caused it is
cut off, and a command's caller gets CoreError.

The core has no known bug left to trip these paths, so each test injects one: a method
of the real core replaced by one that raises (a unit test of the runtime layer). Before
containment covered timers, `Runtime._timer_loop` let the exception out and the process
ended (`episub node: error: bad range 4995904..9`, issue 13's item 1).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio

from episub import CoreError, Delivery, Node
from episub.proto import messages as m
from tests import hostile_peer
from tests.net_helpers import TOPIC, WAIT, RawPeer, run, wait_until
from tests.test_net_hostile import assert_still_serving, honest_pair

pytestmark = pytest.mark.timeout(120)


def core(node: Node) -> Any:
    """The node's topic machines (the core's Topic object of TOPIC)."""
    return node._running().state._topics[TOPIC]


def core_error_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "episub core error" in r.getMessage()]


def forgive_core_errors(node: Node, expected: int) -> None:
    """Check the count, then reset it for the suite's `no_core_errors` check."""
    assert node.stats()["core_errors"] == expected
    node._running().counters.core_errors = 0


def test_a_core_error_on_a_timer_is_counted_logged_once_and_the_node_carries_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with honest_pair() as (a, b):
            membership = core(a).membership
            real = membership.on_timer

            def on_timer(name: str, now: float, out: list[Any]) -> None:
                real(name, now, out)  # the ping timer is armed again, and fails again
                if name == "ping":
                    raise ValueError("injected")

            monkeypatch.setattr(membership, "on_timer", on_timer)
            await wait_until(lambda: a.stats()["core_errors"] >= 3, what="three core errors")
            monkeypatch.undo()
            await assert_still_serving(a, b)  # the timer task lives on
            errors = a.stats()["core_errors"]
            assert errors >= 3
            forgive_core_errors(a, errors)

    with caplog.at_level(logging.ERROR, logger="episub.net"):
        run(main)
    lines = core_error_lines(caplog)
    assert len(lines) == 1, lines  # once a minute per kind
    assert "TimerFired" in lines[0] and "injected" in lines[0]


def test_a_core_error_on_a_peers_frame_cuts_that_peer_off_and_the_node_carries_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def main() -> None:
        async with honest_pair() as (a, b):
            raw = await RawPeer.connect(a.address)
            await hostile_peer.join_as_neighbour(raw, TOPIC)
            broadcast = core(a).broadcast
            real = broadcast.on_message

            def on_message(peer: object, msg: object, now: float, out: list[Any]) -> None:
                if peer == raw.id:
                    raise ValueError("injected")
                real(peer, msg, now, out)

            monkeypatch.setattr(broadcast, "on_message", on_message)
            await raw.send_items([(TOPIC, m.Prune())])
            with trio.fail_after(WAIT):
                await raw.wait_closed()  # cut off
            monkeypatch.undo()
            await assert_still_serving(a, b)
            assert raw.id not in [n.peer_id for n in a.neighbors(TOPIC)]
            forgive_core_errors(a, 1)

    run(main)


def test_what_a_burst_delivered_before_a_core_error_still_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """All the frames of one read go into the core as one input (the fast path). A failure
    on a later item must not lose what the earlier ones did: their state changed (the
    message is seen), so their outputs (the forward to b) must go out too, or b would
    never get the message from this node."""

    async def main() -> None:
        async with honest_pair() as (a, b), b.subscribe(TOPIC) as at_b:
            raw = await RawPeer.connect(a.address)
            await hostile_peer.join_as_neighbour(raw, TOPIC)
            broadcast = core(a).broadcast
            real = broadcast.on_message

            def on_message(peer: object, msg: object, now: float, out: list[Any]) -> None:
                if peer == raw.id and isinstance(msg, m.Prune):
                    raise ValueError("injected")
                real(peer, msg, now, out)

            monkeypatch.setattr(broadcast, "on_message", on_message)
            gossip = hostile_peer.forged_gossip(TOPIC, raw.id, 0)
            await raw.send_items([(TOPIC, gossip), (TOPIC, m.Prune())])  # one frame
            with trio.fail_after(WAIT):
                await raw.wait_closed()  # cut off
                item = await at_b.receive()  # and the message before the failure went on
            assert isinstance(item, Delivery) and item.id == gossip.id
            monkeypatch.undo()
            forgive_core_errors(a, 1)

    run(main)


def test_a_core_error_on_a_command_reaches_the_caller_as_core_error_and_the_node_carries_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def main() -> None:
        async with honest_pair() as (a, b):
            topic = core(a)

            def publish_many(*args: object, **kwargs: object) -> None:
                raise ValueError("injected")

            monkeypatch.setattr(topic, "publish_many", publish_many)  # Node.publish's way in
            with pytest.raises(CoreError, match="injected"):
                await a.publish(TOPIC, b"lost")
            monkeypatch.undo()
            await assert_still_serving(a, b)
            forgive_core_errors(a, 1)

    run(main)


def test_misbehaving_peers_are_logged_at_most_once_a_minute_per_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with honest_pair() as (a, b):
            raw = await RawPeer.connect(a.address)
            for nonce in range(50):  # a PONG answering no PING: misbehaviour, each one
                await raw.send_items([(TOPIC, m.Pong(nonce=nonce))])
            await wait_until(lambda: a.stats()["peer_misbehaved"] >= 50, what="50 counted")
            await assert_still_serving(a, b)

    with caplog.at_level(logging.WARNING, logger="episub.net"):
        run(main)
    lines = [r.getMessage() for r in caplog.records if "misbehaved" in r.getMessage()]
    assert len(lines) == 1, lines
