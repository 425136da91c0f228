"""Signed publishing on real sockets and processes: a member holding the deployment key (a
RawPeer with a signing identity of its own) forges and alters messages of another node;
with signing on, they are dropped and counted, and the honest stream goes on.

Issue 13, item 3: a forged GOSSIP under another node's publisher id at seq + 5,000,000 made
every subscriber report the range lost and drop that publisher's later messages.
"""

from __future__ import annotations

import logging
import time

import pytest
import trio

from episub import Delivery, Node
from episub.agent import AgentClient, AgentUnavailable, ensure_agent
from episub.proto.envelope import message_id
from episub.proto.messages import Envelope, Gossip, Signature
from episub.proto.signing import MESSAGE_DOMAIN, Signer
from tests.hostile_peer import join_as_neighbour
from tests.net_helpers import KEY, TOPIC, WAIT, RawPeer, fast_config, run, wait_until
from tests.proc_helpers import Processes, node_ready, start_node, wait_for_neighbour

pytestmark = pytest.mark.timeout(120)


def forged(publisher: bytes, seq: int, payload: bytes, signer: Signer) -> Gossip:
    """A GOSSIP under `publisher`'s id, signed with `signer`'s key (not the publisher's)."""
    envelope = Envelope(
        publisher=publisher, seq=seq, timestamp_ms=int(time.time() * 1000), payload=payload
    )
    mid = message_id(TOPIC, envelope)
    signature = Signature(signer=signer.public_key, value=signer.sign(MESSAGE_DOMAIN + mid))
    return Gossip(id=mid, envelope=envelope.signed(signature), hops=1)


async def forge_at(address: str, gossips: list[Gossip]) -> None:
    """Connect to `address` as a signing member, become its neighbour, send `gossips`."""
    raw = await RawPeer.connect(address, signer=Signer.generate())
    await join_as_neighbour(raw, TOPIC)
    await raw.send_items([(TOPIC, g) for g in gossips])
    await raw.aclose()


# -- processes: acceptance 3, the signing-on half ----------------------------------------


def stats(socket_path: str) -> dict[str, int]:
    with AgentClient(socket_path) as client:
        return client.inspect().stats


def receive(subscription: object, count: int) -> list[tuple[bytes, int]]:
    got = []
    while len(got) < count:
        item = subscription.receive(timeout=WAIT)  # type: ignore[attr-defined]
        assert isinstance(item, Delivery), (item, got)  # not None, Lost or Lagged
        got.append((item.publisher, item.seq))
    return got


def test_a_forged_gossip_far_ahead_under_a_publishers_id_is_dropped_and_its_stream_goes_on(
    processes: Processes,
) -> None:
    sockets = {name: str(processes.dir / f"{name}.sock") for name in "abc"}
    b = start_node(processes, "b", signed=True, config=processes.config_file())
    _, b_address = node_ready(b)
    a = start_node(processes, "a", bootstrap=[b_address], signed=True)
    c = start_node(processes, "c", bootstrap=[b_address], signed=True)
    a_id, _ = node_ready(a)
    node_ready(c)
    for name in "ac":
        wait_for_neighbour(sockets[name])
    with AgentClient(sockets["c"]) as at_c, AgentClient(sockets["a"]) as publisher:
        subscription = at_c.subscribe(TOPIC)
        publisher.publish_batch(TOPIC, [b"m%d" % i for i in range(20)])
        assert receive(subscription, 20) == [(a_id.encode(), i) for i in range(20)]
        # A member of the deployment, not A, speaks as A: far ahead, then at A's next place.
        attack = [
            forged(a_id.encode(), 19 + 5_000_000, b"forged", Signer.generate()),
            forged(a_id.encode(), 20, b"forged", Signer.generate()),
        ]
        trio.run(forge_at, b_address, attack)
        wait_until_stat(sockets["b"], "bad_signatures", 2)
        publisher.publish_batch(TOPIC, [b"m%d" % i for i in range(20, 60)])
        assert receive(subscription, 40) == [(a_id.encode(), i) for i in range(20, 60)]
    assert stats(sockets["b"])["bad_signatures"] == 2  # dropped where it entered
    for name in "ac":
        assert stats(sockets[name])["bad_signatures"] == 0  # never forwarded


def wait_until_stat(socket_path: str, name: str, value: int) -> None:
    deadline = time.monotonic() + WAIT
    while stats(socket_path)[name] < value:
        assert time.monotonic() < deadline, f"{name} of {socket_path} never reached {value}"
        time.sleep(0.05)


# -- in-process nodes, real TCP: forged and altered, one each ---------------------------


def test_a_forged_and_an_altered_message_are_dropped_counted_and_never_delivered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="episub.net")

    async def main() -> None:
        async with (
            Node(key=KEY, config=fast_config(), sign=True) as a,
            Node(key=KEY, config=fast_config(), sign=True) as b,
        ):
            await a.join(TOPIC)
            await b.join(TOPIC, bootstrap=[a.address])
            member = Signer.generate()
            # The member is a's neighbour and receives a's genuine message...
            spy = await RawPeer.connect(a.address, signer=member)
            await join_as_neighbour(spy, TOPIC)
            async with b.subscribe(TOPIC) as at_b:
                await a.publish(TOPIC, b"pay 10")
                with trio.fail_after(WAIT):
                    genuine = await first_gossip(spy)
                    item = await at_b.receive()
                assert isinstance(item, Delivery) and item.value == b"pay 10"
                # ...alters it (a member can recompute the id) and forges a's next one.
                envelope = genuine.envelope.replace(payload=b"pay 1000")
                altered = Gossip(id=message_id(TOPIC, envelope), envelope=envelope, hops=1)
                fake = forged(a.id, 1, b"pay 99", member)
                raw = await RawPeer.connect(b.address, signer=member)
                await join_as_neighbour(raw, TOPIC)
                await raw.send_items([(TOPIC, altered), (TOPIC, fake)])
                await wait_until(lambda: b.stats()["bad_signatures"] == 2, what="both dropped")
                await a.publish(TOPIC, b"pay 20")  # a's real seq 1
                with trio.fail_after(WAIT):
                    item = await at_b.receive()
                assert isinstance(item, Delivery) and (item.seq, item.value) == (1, b"pay 20")
                assert at_b.dropped == 0
            assert b.stats()["peer_misbehaved"] == 2
            await spy.aclose()
            await raw.aclose()

    run(main)
    assert "signature that does not verify" in caplog.text
    assert "signed by a key its publisher id is not bound to" in caplog.text


async def first_gossip(raw: RawPeer) -> Gossip:
    while True:
        frame = await raw.reader.receive_frame()
        assert frame is not None, "the node closed the connection"
        for _, message in frame:
            if isinstance(message, Gossip):
                return message


# -- mixed deployments fail clearly -------------------------------------------------------


def test_an_unsigned_node_cannot_join_a_signed_one_and_says_why_in_one_line(
    processes: Processes,
) -> None:
    signed = start_node(processes, "signed", signed=True)
    _, address = node_ready(signed)
    plain = start_node(processes, "plain", bootstrap=[address])
    assert plain.wait() == 1
    lines = plain.stderr_text().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("episub node: error: could not reach any bootstrap address")
    assert "peer signs its messages, this node does not" in lines[0]
    assert "every node of a deployment must use the same setting (--signed)" in lines[0]


def test_an_agent_running_with_the_other_signing_setting_is_not_attached_to(
    processes: Processes,
) -> None:
    path = str(processes.dir / "agent.sock")
    info = ensure_agent(path, key=KEY, idle_timeout=60.0)
    processes.pids.append(info.pid)
    with pytest.raises(AgentUnavailable, match="runs with signed publishing off, and this"):
        ensure_agent(path, key=KEY, idle_timeout=60.0, sign=True)
    assert stats(path)["signed"] == 0


def test_a_signed_agent_reports_it(processes: Processes) -> None:
    path = str(processes.dir / "agent.sock")
    info = ensure_agent(path, key=KEY, idle_timeout=60.0, sign=True)
    processes.pids.append(info.pid)
    assert stats(path)["signed"] == 1
    assert ensure_agent(path, key=KEY, sign=True).pid == info.pid
