"""The handshake: both ends prove the deployment key before a single frame counts.

Sans-IO pairs wired by hand (h11's way), then the async glue over trio's in-memory
streams with a MockClock, so the timeout is checked without waiting for it.
"""

from __future__ import annotations

import struct

import pytest
import trio
import trio.testing

from episub.net.handshake import (
    MAX_HANDSHAKE_FRAME,
    PROTOCOL_VERSION,
    Handshake,
    HandshakeError,
    perform_handshake,
)
from episub.proto import episub_pb2 as pb

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
ALICE = b"127.0.0.1:7001/00000000000000a1"
BOB = b"127.0.0.1:7002/00000000000000b0"
MALLORY = b"127.0.0.1:7003/0000000000000666"


def machine(
    *, initiator: bool, key: bytes = KEY, me: bytes | None = None, nonce: bytes | None = None
) -> Handshake:
    me = me if me is not None else (ALICE if initiator else BOB)
    nonce = nonce if nonce is not None else (b"\x01" if initiator else b"\x02") * 32
    return Handshake(key=key, my_id=me, initiator=initiator, nonce=nonce)


def shuttle(a: Handshake, b: Handshake, *, step: int | None = None) -> None:
    """Carry bytes both ways until neither side has anything to say (`step`: chunk size)."""
    while True:
        moved = False
        for src, dst in ((a, b), (b, a)):
            data = src.data_to_send()
            if data and not dst.done:
                moved = True
                chunks = (
                    [data]
                    if step is None
                    else [data[i : i + step] for i in range(0, len(data), step)]
                )
                for chunk in chunks:
                    dst.receive_data(chunk)
        if not moved:
            return


def framed(message: pb.Handshake) -> bytes:
    body = message.SerializeToString()
    return struct.pack(">I", len(body)) + body


def hello(
    *,
    version: int = PROTOCOL_VERSION,
    peer_id: bytes = MALLORY,
    nonce: bytes = b"\x03" * 32,
    plaintext: bool = False,
) -> bytes:
    message = pb.Handshake()
    message.hello.version = version
    message.hello.peer_id = peer_id
    message.hello.nonce = nonce
    message.hello.plaintext = plaintext
    return framed(message)


def proof(mac: bytes) -> bytes:
    message = pb.Handshake()
    message.proof.mac = mac
    return framed(message)


# -- sans-IO -----------------------------------------------------------------------------


def test_two_holders_of_the_key_learn_each_others_id_and_one_session_key() -> None:
    a, b = machine(initiator=True), machine(initiator=False)
    shuttle(a, b)
    assert a.done and b.done
    assert a.result.peer_id == BOB and b.result.peer_id == ALICE
    assert a.result.session_key == b.result.session_key
    assert len(a.result.session_key) == 32


def test_the_handshake_survives_bytes_arriving_one_at_a_time() -> None:
    a, b = machine(initiator=True), machine(initiator=False)
    shuttle(a, b, step=1)
    assert a.done and b.done and a.result.session_key == b.result.session_key


def test_each_connection_gets_its_own_session_key() -> None:
    a1, b1 = machine(initiator=True), machine(initiator=False)
    a2, b2 = machine(initiator=True, nonce=b"\x05" * 32), machine(initiator=False)
    shuttle(a1, b1)
    shuttle(a2, b2)
    assert a1.result.session_key != a2.result.session_key


def test_bytes_after_the_peers_proof_are_handed_on_as_trailing_data() -> None:
    a, b = machine(initiator=True), machine(initiator=False)
    b.receive_data(a.data_to_send())  # b answers with hello + proof
    a.receive_data(b.data_to_send())  # a is done and sends its proof
    assert a.done
    b.receive_data(a.data_to_send() + b"\x00\x00\x00\x03abc")  # proof + the first frame
    assert b.done
    assert b.result.trailing_data == b"\x00\x00\x00\x03abc"


def hello_only(data: bytes) -> bytes:
    """The first handshake frame of `data` (a hello), without the proof behind it."""
    (length,) = struct.unpack_from(">I", data)
    return data[: 4 + length]


def test_the_initiator_rejects_a_responder_with_another_key() -> None:
    a, b = machine(initiator=True), machine(initiator=False, key=OTHER_KEY)
    b.receive_data(a.data_to_send())
    with pytest.raises(HandshakeError, match="failed to prove the deployment key"):
        a.receive_data(b.data_to_send())


def test_the_responder_rejects_an_initiator_with_another_key() -> None:
    liar, b = machine(initiator=True, key=OTHER_KEY), machine(initiator=False)
    b.receive_data(liar.data_to_send())
    liar.receive_data(hello_only(b.data_to_send()))  # so the liar does not stop at b's proof
    with pytest.raises(HandshakeError, match="failed to prove the deployment key"):
        b.receive_data(liar.data_to_send())


def test_a_reflected_proof_fails_because_the_role_is_in_the_mac() -> None:
    b = machine(initiator=False)
    b.receive_data(hello())
    answer = b.data_to_send()
    bobs_proof = answer[len(hello_only(answer)) :]
    with pytest.raises(HandshakeError, match="failed to prove"):
        b.receive_data(bobs_proof)  # Mallory sends Bob's own proof back


def test_a_proof_recorded_on_another_connection_fails() -> None:
    a, b = machine(initiator=True), machine(initiator=False)
    b.receive_data(a.data_to_send())
    a.receive_data(b.data_to_send())
    recorded = a.data_to_send()  # Alice's proof for this connection
    fresh = machine(initiator=False, nonce=b"\x09" * 32)
    fresh.receive_data(machine(initiator=True).data_to_send())  # the same hello replayed
    with pytest.raises(HandshakeError, match="failed to prove"):
        fresh.receive_data(recorded)


def test_another_protocol_version_is_refused_naming_both_versions() -> None:
    b = machine(initiator=False)
    with pytest.raises(HandshakeError, match=f"version 2, this node speaks {PROTOCOL_VERSION}"):
        b.receive_data(hello(version=2))


@pytest.mark.parametrize(
    ("data", "message", "reason"),
    [
        (hello(peer_id=b"no-address"), "malformed hello", "malformed"),
        (hello(nonce=b"short"), "nonce of 5 bytes", "malformed"),
        (hello(peer_id=BOB), "connected to ourselves", "self"),
        (hello(nonce=b"\x02" * 32), "echoed our nonce", "malformed"),
        (hello(version=2), "version 2", "version"),
        (hello(plaintext=True), "peer has encryption off", "encryption"),
        (proof(b"\x00" * 32), "expected a hello, got proof", "malformed"),
        (
            struct.pack(">I", 2) + b"\x18\x01",
            "expected a hello, got an empty or unknown",
            "malformed",
        ),
        (struct.pack(">I", 3) + b"\xff\xff\xff", "malformed handshake frame", "malformed"),
        (
            struct.pack(">I", MAX_HANDSHAKE_FRAME + 1),
            f"{MAX_HANDSHAKE_FRAME + 1} bytes announced",
            "malformed",
        ),
        (b"GET / HTTP/1.1\r\n\r\n", "bytes announced", "malformed"),
        (struct.pack(">I", 0), "0 bytes announced", "malformed"),
    ],
)
def test_a_bad_hello_fails_with_its_message_and_reason(
    data: bytes, message: str, reason: str
) -> None:
    b = machine(initiator=False)
    with pytest.raises(HandshakeError, match=message) as caught:
        b.receive_data(data)
    assert caught.value.reason == reason


def test_a_second_hello_instead_of_a_proof_fails() -> None:
    b = machine(initiator=False)
    b.receive_data(hello())
    with pytest.raises(HandshakeError, match="expected a proof, got hello"):
        b.receive_data(hello(nonce=b"\x04" * 32))


def test_a_failed_handshake_refuses_further_use() -> None:
    b = machine(initiator=False)
    with pytest.raises(HandshakeError):
        b.receive_data(hello(version=9))
    with pytest.raises(HandshakeError, match="already failed"):
        b.receive_data(hello())
    with pytest.raises(RuntimeError, match="not complete"):
        b.result  # noqa: B018


def test_keys_and_nonces_of_the_wrong_size_are_a_usage_error() -> None:
    with pytest.raises(ValueError, match=r"key must be 32 bytes .*, not 3 bytes"):
        Handshake(key=b"abc", my_id=ALICE, initiator=True, nonce=b"\x00" * 32)
    with pytest.raises(ValueError, match="nonce must be 32 bytes, not 1"):
        Handshake(key=KEY, my_id=ALICE, initiator=True, nonce=b"\x00")


# -- over a stream -----------------------------------------------------------------------


async def _both(key_a: bytes = KEY, key_b: bytes = KEY) -> list[object]:
    left, right = trio.testing.memory_stream_pair()
    results: list[object] = [None, None]

    async def side(
        index: int, stream: trio.abc.Stream, key: bytes, me: bytes, initiator: bool
    ) -> None:
        try:
            results[index] = await perform_handshake(stream, key=key, my_id=me, initiator=initiator)
        except HandshakeError as exc:
            results[index] = exc
            await stream.aclose()  # as the runtime does: the other side sees the close

    async with trio.open_nursery() as nursery:
        nursery.start_soon(side, 0, left, key_a, ALICE, True)
        nursery.start_soon(side, 1, right, key_b, BOB, False)
    return results


def test_perform_handshake_over_a_stream() -> None:
    a, b = trio.run(_both)
    assert a.peer_id == BOB and b.peer_id == ALICE  # type: ignore[union-attr]
    assert a.session_key == b.session_key  # type: ignore[union-attr]


def test_perform_handshake_with_a_wrong_key_fails_on_both_ends() -> None:
    a, b = trio.run(_both, KEY, OTHER_KEY)
    assert isinstance(a, HandshakeError) and isinstance(b, HandshakeError)
    assert "deployment key" in str(a)
    assert a.reason == "wrong_key" == b.reason


def test_a_silent_peer_times_out_after_handshake_timeout() -> None:
    async def main() -> None:
        left, _right = trio.testing.memory_stream_pair()
        start = trio.current_time()
        with pytest.raises(HandshakeError, match=r"within 5\.0 s") as caught:
            await perform_handshake(left, key=KEY, my_id=ALICE, initiator=True, timeout=5.0)
        assert trio.current_time() - start == pytest.approx(5.0)
        assert caught.value.reason == "timeout"

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_peer_closing_mid_handshake_is_a_handshake_error() -> None:
    async def main() -> None:
        left, right = trio.testing.memory_stream_pair()
        await right.aclose()
        with pytest.raises(
            HandshakeError, match=r"closed the connection|connection failed"
        ) as caught:
            await perform_handshake(left, key=KEY, my_id=ALICE, initiator=True)
        assert caught.value.reason in ("closed", "broken")

    trio.run(main)
