"""Signed publishing (episub/proto/signing.py): one test per rule, on the sans-IO core, the
wire codec and the handshake. The tests on real sockets are in tests/test_net_signing.py.

The node under test (ME) signs; its neighbour N relays. Publishers are bytes ids bound to
their own keys (`signed_id`); FORGER holds the deployment key and an identity of its own,
but not A's private key.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episub.net.handshake import Handshake, HandshakeError
from episub.proto import episub_pb2 as pb
from episub.proto import messages as m
from episub.proto.envelope import message_id
from episub.proto.errors import LocalProtocolError
from episub.proto.events import (
    DataLost,
    Deliver,
    OutEvent,
    PeerMisbehaved,
    Publish,
    Published,
    Send,
)
from episub.proto.node import NodeState
from episub.proto.signing import (
    MESSAGE_DOMAIN,
    Signer,
    bound_tag,
    check_message,
    claimed_tag,
    verify,
)
from episub.proto.wire import FrameDecoder, encode_frame
from tests.helpers import TOPIC, broadcast, fire, make_node, received

N = 1  # a neighbour that relays


def signed_id(signer: Signer, port: int) -> bytes:
    return b"127.0.0.1:%d/" % port + signer.tag


SIGNER_ME, SIGNER_A, SIGNER_FORGER = Signer.generate(), Signer.generate(), Signer.generate()
ME = signed_id(SIGNER_ME, 7000)
A = signed_id(SIGNER_A, 7001)
FORGER = signed_id(SIGNER_FORGER, 7666)


def signed_node(*, signer: Signer | None = SIGNER_ME) -> NodeState:
    return make_node(ME, active=[N], signer=signer)


def envelope(publisher: bytes, seq: int, payload: bytes = b"x") -> m.Envelope:
    return m.Envelope(publisher=publisher, seq=seq, timestamp_ms=1000 + seq, payload=payload)


def signed(signer: Signer, e: m.Envelope) -> m.Gossip:
    """A GOSSIP of `e` signed by `signer`, whoever `e`'s publisher is."""
    mid = message_id(TOPIC, e)
    signature = m.Signature(signer=signer.public_key, value=signer.sign(MESSAGE_DOMAIN + mid))
    return m.Gossip(id=mid, envelope=e.signed(signature), hops=1)


def delivered(out: list[OutEvent]) -> list[int]:
    return [e.envelope.seq for e in out if isinstance(e, Deliver)]


# -- binding ------------------------------------------------------------------------------


def test_a_signing_nodes_id_tag_is_derived_from_its_public_key() -> None:
    assert len(SIGNER_A.tag) == 32 and SIGNER_A.tag == bound_tag(SIGNER_A.public_key)
    assert claimed_tag(A) == SIGNER_A.tag and SIGNER_A.binds(A)
    assert not SIGNER_FORGER.binds(A)
    assert bound_tag(SIGNER_FORGER.public_key) != SIGNER_A.tag


@pytest.mark.parametrize(
    "publisher",
    [
        b"127.0.0.1:7000/0123456789abcdef",  # an unsigned node's random 16-hex tag
        b"sink/3f2a/17/4",  # the Spark sink's named streams
        b"x" * 33,
        b"/" + b"0" * 31,  # too short to hold a tag
        b"h:1/" + b"0123456789ABCDEF" * 2,  # upper case: not ours
        b"h:1-" + b"0" * 32,  # no slash
        7,  # the simulator's int ids
    ],
)
def test_a_publisher_id_claims_a_key_only_when_it_ends_in_slash_and_32_lowercase_hex(
    publisher: object,
) -> None:
    assert claimed_tag(publisher) is None  # type: ignore[arg-type]


def test_the_core_refuses_a_signer_its_id_is_not_bound_to() -> None:
    with pytest.raises(LocalProtocolError, match="not bound"):
        make_node(A, signer=SIGNER_ME)


def test_a_signers_repr_never_shows_its_private_key() -> None:
    assert repr(SIGNER_A) == f"Signer(tag={SIGNER_A.tag.decode()})"


# -- publishing and first receipt ----------------------------------------------------------


def test_what_a_signing_node_publishes_carries_a_signature_of_its_id() -> None:
    node = signed_node()
    out = node.handle(Publish(TOPIC, b"v", None, (), None), 5.0)
    published = next(e for e in out if isinstance(e, Published))
    signature = published.envelope.signature
    assert signature is not None and signature.signer == SIGNER_ME.public_key
    assert check_message(published.id, published.envelope) is None
    pushed = [e.message for e in out if isinstance(e, Send)]
    assert pushed == [m.Gossip(id=published.id, envelope=published.envelope, hops=1)]


def test_a_message_signed_by_its_bound_publisher_is_delivered_and_forwarded_signed() -> None:
    node = make_node(ME, active=[N, 2], signer=SIGNER_ME)
    gossip = signed(SIGNER_A, envelope(A, 0))
    out = node.handle(received(N, gossip), 1.0)
    assert delivered(out) == [0]
    forwarded = [e.message for e in out if isinstance(e, Send) and e.peer == 2]
    assert forwarded == [gossip.forwarded(2)]  # the signature travels on
    assert broadcast(node).counters.bad_signatures == 0


@pytest.mark.parametrize(
    ("gossip", "problem"),
    [
        # Another member's key under A's id: the forger holds the deployment key only.
        (
            signed(SIGNER_FORGER, envelope(A, 3)),
            "is signed by a key its publisher id is not bound to",
        ),
        # A's key presented, but the forger cannot make A's signature.
        (
            m.Gossip(
                id=message_id(TOPIC, envelope(A, 3)),
                envelope=envelope(A, 3).signed(
                    m.Signature(signer=SIGNER_A.public_key, value=b"\x01" * 64)
                ),
                hops=1,
            ),
            "has a signature that does not verify",
        ),
        (
            m.Gossip(id=message_id(TOPIC, envelope(A, 3)), envelope=envelope(A, 3), hops=1),
            "is not signed",
        ),
    ],
    ids=["another-key", "bad-signature", "unsigned"],
)
def test_a_forged_message_is_dropped_before_any_state_changes_and_counted(
    gossip: m.Gossip, problem: str
) -> None:
    node = signed_node()
    assert node.handle(received(N, gossip), 1.0) == [
        PeerMisbehaved(N, f"GOSSIP of {A!r} {problem}")
    ]
    b = broadcast(node)
    assert b.counters.bad_signatures == 1
    assert gossip.id not in b.seen and b.store.cached(gossip.id) is None and not b.streams
    # The genuine message at that place is still taken in.
    assert delivered(node.handle(received(N, signed(SIGNER_A, envelope(A, 0))), 2.0)) == [0]


def test_an_altered_message_with_its_id_recomputed_fails_the_publishers_signature() -> None:
    """A key holder can recompute the id of an altered envelope; it cannot re-sign it as A."""
    node = signed_node()
    genuine = signed(SIGNER_A, envelope(A, 0, b"pay 10"))
    altered_envelope = genuine.envelope.replace(payload=b"pay 1000")
    altered = m.Gossip(id=message_id(TOPIC, altered_envelope), envelope=altered_envelope, hops=1)
    out = node.handle(received(N, altered), 1.0)
    assert [type(e) for e in out] == [PeerMisbehaved]
    assert "does not verify" in out[0].reason  # type: ignore[union-attr]
    assert broadcast(node).counters.bad_signatures == 1
    assert delivered(node.handle(received(N, genuine), 2.0)) == [0]


def test_a_forgery_far_ahead_of_a_publisher_leaves_its_stream_alone() -> None:
    """Issue 13, item 3, signing on: a forged GOSSIP under A's id at seq + 5,000,000 is
    dropped, and A's stream goes on being delivered, with no gap to pull and nothing lost."""
    node = signed_node()
    got: list[int] = []
    for seq in range(6):
        got += delivered(node.handle(received(N, signed(SIGNER_A, envelope(A, seq))), 1.0 + seq))
    forged = signed(SIGNER_FORGER, envelope(A, 5 + 5_000_000))
    assert [type(e) for e in node.handle(received(N, forged), 7.0)] == [PeerMisbehaved]
    for seq in range(6, 12):
        got += delivered(node.handle(received(N, signed(SIGNER_A, envelope(A, seq))), 8.0 + seq))
    later = fire(node, "gap", 30.0)
    assert got == list(range(12))
    assert not any(isinstance(e, DataLost) for e in later)
    assert not any(isinstance(e, Send) and isinstance(e.message, m.Pull) for e in later)
    assert broadcast(node).counters.bad_signatures == 1


def test_named_streams_are_neither_signed_nor_checked() -> None:
    """Named streams are bound to no key: any member may write them (a Spark task retried
    on another executor), so a signature by whatever key the writer chose would prove
    nothing. They are as without signing."""
    node = signed_node()
    unsigned = m.Gossip(
        id=message_id(TOPIC, envelope(b"sink/q/7/0", 0)),
        envelope=envelope(b"sink/q/7/0", 0),
        hops=1,
    )
    assert delivered(node.handle(received(N, unsigned), 1.0)) == [0]
    by_anyone = signed(SIGNER_FORGER, envelope(b"sink/q/7/0", 1))
    assert delivered(node.handle(received(N, by_anyone), 2.0)) == [1]
    out = node.handle(Publish(TOPIC, b"v", None, (), (b"sink/q/7/0", 2)), 3.0)
    assert [e.envelope.signature for e in out if isinstance(e, Deliver)] == [None]
    assert broadcast(node).counters.bad_signatures == 0


def test_a_node_cannot_publish_at_a_named_stream_that_looks_like_another_nodes_id() -> None:
    node = signed_node()
    with pytest.raises(LocalProtocolError, match="another signing node's id"):
        node.handle(Publish(TOPIC, b"v", None, (), (A, 0)), 1.0)
    assert broadcast(node).counters.published == 0
    assert delivered(node.handle(Publish(TOPIC, b"v", None, (), (b"sink/q/1/0", 0)), 1.0)) == [0]


def test_a_node_that_does_not_sign_neither_signs_nor_checks() -> None:
    # An id of bytes, as every publisher of the store is (A's is): the store orders them.
    node = make_node(b"127.0.0.1:7007/unsigned", active=[N])
    out = node.handle(Publish(TOPIC, b"v", None, (), None), 1.0)
    assert next(e for e in out if isinstance(e, Published)).envelope.signature is None
    forged = signed(SIGNER_FORGER, envelope(A, 0))
    assert delivered(node.handle(received(N, forged), 2.0)) == [0]


# -- the wire ------------------------------------------------------------------------------


def decode(data: bytes) -> list[tuple[str | None, m.PeerMessage]]:
    decoder = FrameDecoder(max_frame_size=1 << 20)
    decoder.feed(data)
    frame = decoder.next_frame()
    assert frame is not None
    return frame


def test_a_signature_survives_the_wire_and_an_unsigned_envelope_stays_unsigned() -> None:
    gossip = signed(SIGNER_A, envelope(A, 0))
    plain = m.Gossip(id=gossip.id, envelope=envelope(A, 0), hops=1)
    assert decode(encode_frame([(TOPIC, gossip), (TOPIC, plain)])) == [
        (TOPIC, gossip),
        (TOPIC, plain),
    ]


@pytest.mark.parametrize(
    ("signer", "value"), [(b"k" * 31, b"s" * 64), (b"k" * 32, b""), (b"", b"s" * 64)]
)
def test_a_signature_of_the_wrong_size_is_refused_with_its_envelope(
    signer: bytes, value: bytes
) -> None:
    """Envelopes are decoded on a GOSSIP's first receipt, not by the frame decoder (a
    duplicate never is): the bad signature is found then, and the sender reported."""
    gossip = signed(SIGNER_A, envelope(A, 0))
    data = bytearray(encode_frame([(TOPIC, gossip)]))
    # Rebuild the protobuf by hand: the dataclass refuses these sizes.
    frame = pb.Frame()
    frame.ParseFromString(bytes(data[4:]))
    frame.items[0].gossip.envelope.signer = signer
    frame.items[0].gossip.envelope.signature = value
    body = frame.SerializeToString()
    [(_, decoded)] = decode(len(body).to_bytes(4, "big") + body)
    with pytest.raises(ValueError):
        _ = decoded.envelope


def test_verify_says_no_to_garbage_keys_and_signatures() -> None:
    assert not verify(b"\xff" * 32, b"\x00" * 64, b"data")
    assert not verify(b"short", b"\x00" * 64, b"data")
    assert verify(SIGNER_A.public_key, SIGNER_A.sign(b"data"), b"data")


# -- the handshake -------------------------------------------------------------------------

KEY = bytes(range(32))


def handshake(me: bytes, signer: Signer | None, *, initiator: bool) -> Handshake:
    nonce = (b"\x01" if initiator else b"\x02") * 32
    return Handshake(key=KEY, my_id=me, initiator=initiator, nonce=nonce, signer=signer)


def shuttle(a: Handshake, b: Handshake) -> None:
    while (data := a.data_to_send()) or (back := b.data_to_send()):
        if data:
            b.receive_data(data)
        else:
            a.receive_data(back)


def test_two_signing_nodes_complete_the_handshake() -> None:
    a, b = handshake(A, SIGNER_A, initiator=True), handshake(ME, SIGNER_ME, initiator=False)
    shuttle(a, b)
    assert a.done and b.done and (a.result.peer_id, b.result.peer_id) == (ME, A)


@pytest.mark.parametrize("signing_end", ["initiator", "responder"])
def test_a_signing_and_a_non_signing_node_fail_the_handshake_clearly(signing_end: str) -> None:
    plain_id = b"127.0.0.1:7009/0123456789abcdef"
    if signing_end == "initiator":
        a, b = handshake(A, SIGNER_A, initiator=True), handshake(plain_id, None, initiator=False)
    else:
        a, b = handshake(plain_id, None, initiator=True), handshake(A, SIGNER_A, initiator=False)
    hellos = a.data_to_send(), b.data_to_send()
    for end, hello in ((b, hellos[0]), (a, hellos[1])):  # both ends see it in the other's hello
        with pytest.raises(HandshakeError, match="every node of a deployment must use the") as e:
            end.receive_data(hello)
        assert e.value.reason == "signing"


def test_a_member_cannot_connect_under_another_members_id() -> None:
    """It can present A's id and A's public key, but not A's signature of the transcript."""

    class Impostor(Signer):
        """Presents A's public key (so A's tag) and signs with the forger's private key."""

        def __init__(self) -> None:
            super().__init__(SIGNER_FORGER._private)
            self.public_key = SIGNER_A.public_key
            self.tag = SIGNER_A.tag

    impostor = Impostor()
    a, b = handshake(A, impostor, initiator=True), handshake(ME, SIGNER_ME, initiator=False)
    with pytest.raises(HandshakeError, match="failed to prove it holds the signing key") as e:
        shuttle(a, b)
    assert e.value.reason == "signing"


def test_an_id_not_bound_to_the_presented_key_fails_the_handshake() -> None:
    a = Handshake(key=KEY, my_id=FORGER, initiator=True, nonce=b"\x01" * 32, signer=SIGNER_FORGER)
    b = handshake(ME, SIGNER_ME, initiator=False)
    hello = bytearray(a.data_to_send())
    at = hello.index(FORGER)
    hello[at : at + len(FORGER)] = A  # same length: the id of another member
    with pytest.raises(HandshakeError, match="is not bound to the signing key") as e:
        b.receive_data(bytes(hello))
    assert e.value.reason == "signing"


# -- arbitrary input, signing on -----------------------------------------------------------

FUZZ = settings(max_examples=200, derandomize=True, deadline=None)
keys_and_signatures = st.one_of(
    st.binary(max_size=80), st.binary(min_size=32, max_size=32), st.binary(min_size=64, max_size=64)
)


@FUZZ
@given(
    signing_key=keys_and_signatures,
    signature=keys_and_signatures,
    mac=st.binary(max_size=40),
    tag=st.sampled_from([b"", SIGNER_A.tag, SIGNER_FORGER.tag, b"0123456789abcdef"]),
)
def test_a_signing_responder_fails_any_hello_and_proof_with_a_handshake_error(
    signing_key: bytes, signature: bytes, mac: bytes, tag: bytes
) -> None:
    responder = handshake(ME, SIGNER_ME, initiator=False)
    message = pb.Handshake()
    message.hello.version = 1
    message.hello.peer_id = b"127.0.0.1:7001/" + (tag or b"0" * 32)
    message.hello.nonce = b"\x05" * 32
    message.hello.signing_key = signing_key
    proof = pb.Handshake()
    proof.proof.mac = mac
    proof.proof.signature = signature
    data = b"".join(
        len(body).to_bytes(4, "big") + body
        for body in (message.SerializeToString(), proof.SerializeToString())
    )
    with pytest.raises(HandshakeError):
        responder.receive_data(data)
    assert not responder.done


@FUZZ
@given(
    publisher=st.sampled_from([A, FORGER, ME, b"h:1/" + b"0" * 32]),
    seq=st.integers(0, 1 << 62),
    signer=st.binary(min_size=32, max_size=32),
    value=st.binary(min_size=64, max_size=64),
    use_a_key=st.booleans(),
)
def test_a_signing_node_drops_any_node_message_not_signed_by_its_publisher_never_raising(
    publisher: bytes, seq: int, signer: bytes, value: bytes, use_a_key: bool
) -> None:
    node = signed_node()
    e = envelope(publisher, seq)
    key = SIGNER_A.public_key if use_a_key else signer
    forged = e.signed(m.Signature(signer=key, value=value))
    out = node.handle(received(N, m.Gossip(id=message_id(TOPIC, e), envelope=forged, hops=1)), 1.0)
    assert [type(x) for x in out] == [PeerMisbehaved]
    assert broadcast(node).counters.bad_signatures == 1 and not broadcast(node).seen
