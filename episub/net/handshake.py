"""The connection handshake: both ends prove they hold the deployment key.

Sequence, the same at both ends (no round trip waits on the other side's role):

1. send Hello{version, my peer id, 32 fresh random bytes};
2. on the peer's Hello: check it, then send Proof{mac}, where mac is keyed blake3 (the
   32-byte deployment key) over `DOMAIN`, both Hellos (initiator's first) as the bytes
   that travelled, and the sender's role;
3. on the peer's Proof: recompute what the peer's mac must be and compare in constant
   time (hmac.compare_digest). Done.

Why this shape:
- Both nonces are in every mac, so a recorded proof is useless on another connection.
- The role is in the mac, so a peer cannot reflect our own proof back to us.
- Each side verifies before it treats a single byte after the Proof as protocol, so a
  peer without the key never gets a message processed.
- A session key (blake3 derive_key of the deployment key and both nonces) is derived; the
  sealing layer (sealing.py) keys its records with it. Both Hellos say whether the frames
  after the handshake are sealed; ends that disagree fail here, with the reason.
- With signed publishing (episub/proto/signing.py) each Hello also carries the sender's
  Ed25519 public key, its peer id's tag must be derived from that key, and each Proof
  adds a signature of the same transcript as the mac: a member cannot connect under
  another member's id. A signing and a non-signing end fail here, with the reason.

Frames are a 4-byte big-endian length and a protobuf `Handshake` (episub.proto), at most
`MAX_HANDSHAKE_FRAME` bytes, so a stranger cannot make us buffer more than that.
`Handshake` is sans-IO (h11's manner): `receive_data()` in, `data_to_send()` out.
`perform_handshake()` runs it on a trio stream, bounded by a timeout.
"""

from __future__ import annotations

import contextlib
import enum
import hmac
import secrets
import struct
from dataclasses import dataclass

import blake3
import trio
from google.protobuf.message import DecodeError

from episub.net.peer_id import PeerIdError, parse_peer_id
from episub.proto import episub_pb2 as pb
from episub.proto.signing import PUBLIC_KEY_SIZE, Signer, bound_tag, claimed_tag, verify

__all__ = [
    "DOMAIN",
    "FAILURE_REASONS",
    "HANDSHAKE_TIMEOUT",
    "KEY_SIZE",
    "MAX_HANDSHAKE_FRAME",
    "NONCE_SIZE",
    "PROTOCOL_VERSION",
    "Handshake",
    "HandshakeError",
    "HandshakeResult",
    "perform_handshake",
]

PROTOCOL_VERSION = 1
KEY_SIZE = 32  # blake3's keyed mode takes exactly 32 bytes
NONCE_SIZE = 32  # 256 random bits: never repeats
MAC_SIZE = 32  # blake3's default output
DOMAIN = b"episub handshake v1"
SIGNATURE_DOMAIN = b"episub handshake signature v1"  # the Proof's signature (signing on)
SESSION_KEY_CONTEXT = "episub 2025 connection session key v1"  # blake3 derive_key context
# A Hello is ~110 bytes (version, a 64-byte id at most, the nonce; +34 with a signing
# key), a Proof 34 (+66 with a signature).
MAX_HANDSHAKE_FRAME = 256
HANDSHAKE_TIMEOUT = 5.0  # brief: a connection that has not proven itself in 5 s is dropped
_READ_CHUNK = 4096  # handshake reads are small; what follows the Proof is handed on
_LENGTH = struct.Struct(">I")


# Why a handshake failed, one word each; NetCounters counts failures by these.
FAILURE_REASONS = (
    "timeout",  # no complete handshake within the timeout (shorter under pressure)
    "evicted",  # cut to give its slot to a newer connection (admission.py)
    "closed",  # the peer closed the connection before its proof
    "broken",  # the connection failed (reset, refused write, ...)
    "self",  # the peer's hello carried our own id: we dialled ourselves
    "wrong_key",  # the peer's proof does not match: another deployment key
    "version",  # another protocol version
    "encryption",  # the two ends disagree on sealing frames
    "signing",  # the two ends disagree on signing, or the peer's id or signature is not its key's
    "malformed",  # anything else: not an episub peer, or a broken one
)


class HandshakeError(Exception):
    """The handshake failed; the message says why (wrong key, version, malformed, ...)
    and `reason` names the kind, one of FAILURE_REASONS."""

    def __init__(self, message: str, *, reason: str) -> None:
        if reason not in FAILURE_REASONS:
            raise ValueError(f"reason must be one of {FAILURE_REASONS}, not {reason!r}")
        super().__init__(message)
        self.reason = reason


class Role(enum.Enum):
    INITIATOR = b"I"  # dialled
    RESPONDER = b"R"  # accepted


@dataclass(frozen=True, slots=True)
class HandshakeResult:
    peer_id: bytes
    session_key: bytes
    trailing_data: bytes  # bytes after the peer's Proof: the start of its frames


class _State(enum.Enum):
    AWAIT_HELLO = "await hello"
    AWAIT_PROOF = "await proof"
    DONE = "done"
    FAILED = "failed"


def _frame(message: pb.Handshake) -> tuple[bytes, bytes]:
    body = message.SerializeToString()
    return _LENGTH.pack(len(body)) + body, body


def _transcript(domain: bytes, initiator_hello: bytes, responder_hello: bytes, role: Role) -> bytes:
    """What a Proof proves: each part length-prefixed, then the prover's role."""
    parts = (domain, initiator_hello, responder_hello)
    return b"".join(_LENGTH.pack(len(part)) + part for part in parts) + role.value


def _mac(key: bytes, initiator_hello: bytes, responder_hello: bytes, role: Role) -> bytes:
    return blake3.blake3(
        _transcript(DOMAIN, initiator_hello, responder_hello, role), key=key
    ).digest()


def check_key(key: object) -> bytes:
    if not isinstance(key, bytes) or len(key) != KEY_SIZE:
        shown = f"{len(key)} bytes" if isinstance(key, bytes) else repr(key)
        raise ValueError(f"key must be {KEY_SIZE} bytes (blake3 keyed mode), not {shown}")
    return key


class Handshake:
    """One side of the handshake. Feed it the peer's bytes; send what it hands back.

    `receive_data` raises HandshakeError on anything wrong, after which the machine
    refuses further use. Once `done`, `result` has the peer's id, the session key and
    the bytes that came after the peer's Proof.
    """

    def __init__(
        self,
        *,
        key: bytes,
        my_id: bytes,
        initiator: bool,
        nonce: bytes,
        encrypt: bool = True,
        signer: Signer | None = None,
    ) -> None:
        self._key = check_key(key)
        if len(nonce) != NONCE_SIZE:
            raise ValueError(f"nonce must be {NONCE_SIZE} bytes, not {len(nonce)}")
        if signer is not None and not signer.binds(my_id):
            raise ValueError(f"peer id {my_id!r} is not bound to {signer!r}")
        self._signer = signer
        self._peer_signing_key = b""
        self._my_id = my_id
        self._role = Role.INITIATOR if initiator else Role.RESPONDER
        self._nonce = nonce
        hello = pb.Handshake()
        hello.hello.version = PROTOCOL_VERSION
        hello.hello.peer_id = my_id
        hello.hello.nonce = nonce
        hello.hello.plaintext = not encrypt
        if signer is not None:
            hello.hello.signing_key = signer.public_key
        self._encrypt = encrypt
        frame, self._my_hello = _frame(hello)
        self._outgoing = bytearray(frame)
        self._buffer = bytearray()
        self._state = _State.AWAIT_HELLO
        self._peer_hello = b""
        self._peer_nonce = b""
        self._peer_id = b""
        self._result: HandshakeResult | None = None

    @property
    def done(self) -> bool:
        return self._state is _State.DONE

    @property
    def result(self) -> HandshakeResult:
        if self._result is None:
            raise RuntimeError(f"handshake not complete (state: {self._state.value})")
        return self._result

    def data_to_send(self) -> bytes:
        data = bytes(self._outgoing)
        self._outgoing.clear()
        return data

    def receive_data(self, data: bytes | bytearray) -> None:
        if self._state is _State.FAILED:
            raise HandshakeError("handshake already failed", reason="malformed")
        if self._state is _State.DONE:
            raise RuntimeError("handshake is done: its trailing data goes to the frame decoder")
        self._buffer += data
        try:
            while self._state is not _State.DONE:
                body = self._next_frame()
                if body is None:
                    return
                self._on_frame(body)
        except HandshakeError:
            self._state = _State.FAILED
            self._buffer.clear()
            raise

    def _next_frame(self) -> bytes | None:
        if len(self._buffer) < _LENGTH.size:
            return None
        (length,) = _LENGTH.unpack_from(self._buffer)
        if not 0 < length <= MAX_HANDSHAKE_FRAME:
            raise HandshakeError(
                f"handshake frame of {length} bytes announced; they are 1..{MAX_HANDSHAKE_FRAME}"
                " (not an episub peer?)",
                reason="malformed",
            )
        end = _LENGTH.size + length
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[_LENGTH.size : end])
        del self._buffer[:end]
        return body

    def _on_frame(self, body: bytes) -> None:
        message = pb.Handshake()
        try:
            message.ParseFromString(body)
        except DecodeError as exc:
            raise HandshakeError(
                f"malformed handshake frame of {len(body)} bytes: {exc}", reason="malformed"
            ) from None
        kind = message.WhichOneof("body")
        if self._state is _State.AWAIT_HELLO:
            if kind != "hello":
                raise HandshakeError(
                    f"expected a hello, got {kind or 'an empty or unknown message'}",
                    reason="malformed",
                )
            self._on_hello(message.hello, body)
        elif kind != "proof":
            raise HandshakeError(
                f"expected a proof, got {kind or 'an empty or unknown message'}",
                reason="malformed",
            )
        else:
            self._on_proof(message.proof)

    def _on_hello(self, hello: pb.Hello, body: bytes) -> None:
        if hello.version != PROTOCOL_VERSION:
            raise HandshakeError(
                f"peer speaks episub protocol version {hello.version}, "
                f"this node speaks {PROTOCOL_VERSION}",
                reason="version",
            )
        try:
            parse_peer_id(hello.peer_id)
        except PeerIdError as exc:
            raise HandshakeError(f"malformed hello: {exc}", reason="malformed") from None
        if len(hello.nonce) != NONCE_SIZE:
            raise HandshakeError(
                f"malformed hello: nonce of {len(hello.nonce)} bytes, not {NONCE_SIZE}",
                reason="malformed",
            )
        if hello.plaintext == self._encrypt:
            theirs, ours = ("off", "on") if hello.plaintext else ("on", "off")
            raise HandshakeError(
                f"peer has encryption {theirs}, this node has it {ours}: every node of a "
                "deployment must use the same setting",
                reason="encryption",
            )
        self._check_signing_key(hello)
        if hello.peer_id == self._my_id:
            raise HandshakeError(f"connected to ourselves ({self._my_id!r})", reason="self")
        if hello.nonce == self._nonce:
            raise HandshakeError("peer echoed our nonce (a reflected hello)", reason="malformed")
        self._peer_hello, self._peer_nonce, self._peer_id = body, hello.nonce, hello.peer_id
        proof = pb.Handshake()
        proof.proof.mac = _mac(self._key, *self._hellos(), self._role)
        if self._signer is not None:
            proof.proof.signature = self._signer.sign(
                _transcript(SIGNATURE_DOMAIN, *self._hellos(), self._role)
            )
        self._outgoing += _frame(proof)[0]
        self._state = _State.AWAIT_PROOF

    def _check_signing_key(self, hello: pb.Hello) -> None:
        key = hello.signing_key
        if bool(key) != (self._signer is not None):
            theirs, ours = ("signs", "does not") if key else ("does not sign", "signs")
            raise HandshakeError(
                f"peer {theirs} its messages, this node {ours}: every node of a deployment "
                "must use the same setting (--signed)",
                reason="signing",
            )
        if not key:
            return
        if len(key) != PUBLIC_KEY_SIZE:
            raise HandshakeError(
                f"malformed hello: signing key of {len(key)} bytes, not {PUBLIC_KEY_SIZE}",
                reason="malformed",
            )
        if claimed_tag(hello.peer_id) != bound_tag(key):
            raise HandshakeError(
                f"peer id {hello.peer_id!r} is not bound to the signing key it presented",
                reason="signing",
            )
        self._peer_signing_key = key

    def _on_proof(self, proof: pb.Proof) -> None:
        peer_role = Role.RESPONDER if self._role is Role.INITIATOR else Role.INITIATOR
        expected = _mac(self._key, *self._hellos(), peer_role)
        if not hmac.compare_digest(proof.mac, expected):
            raise HandshakeError(
                f"peer {self._peer_id!r} failed to prove the deployment key "
                "(a different key, or not an episub peer)",
                reason="wrong_key",
            )
        if self._signer is not None and not verify(
            self._peer_signing_key,
            proof.signature,
            _transcript(SIGNATURE_DOMAIN, *self._hellos(), peer_role),
        ):
            raise HandshakeError(
                f"peer {self._peer_id!r} failed to prove it holds the signing key its id is "
                "bound to",
                reason="signing",
            )
        initiator_nonce, responder_nonce = (
            (self._nonce, self._peer_nonce)
            if self._role is Role.INITIATOR
            else (self._peer_nonce, self._nonce)
        )
        deriver = blake3.blake3(derive_key_context=SESSION_KEY_CONTEXT)
        deriver.update(self._key + initiator_nonce + responder_nonce)
        self._result = HandshakeResult(
            peer_id=self._peer_id,
            session_key=deriver.digest(),
            trailing_data=bytes(self._buffer),
        )
        self._buffer.clear()
        self._state = _State.DONE

    def _hellos(self) -> tuple[bytes, bytes]:
        if self._role is Role.INITIATOR:
            return self._my_hello, self._peer_hello
        return self._peer_hello, self._my_hello


async def perform_handshake(
    stream: trio.abc.Stream,
    *,
    key: bytes,
    my_id: bytes,
    initiator: bool,
    timeout: float = HANDSHAKE_TIMEOUT,
    encrypt: bool = True,
    signer: Signer | None = None,
) -> HandshakeResult:
    """Run the handshake on `stream`; HandshakeError if it fails or takes over `timeout`.

    The stream is left open either way: the caller owns it.
    """
    machine = Handshake(
        key=key,
        my_id=my_id,
        initiator=initiator,
        nonce=secrets.token_bytes(NONCE_SIZE),
        encrypt=encrypt,
        signer=signer,
    )
    try:
        with trio.fail_after(timeout):
            await stream.send_all(machine.data_to_send())
            while not machine.done:
                data = await stream.receive_some(_READ_CHUNK)
                if not data:
                    raise HandshakeError(
                        "peer closed the connection during the handshake", reason="closed"
                    )
                try:
                    machine.receive_data(data)
                except HandshakeError:
                    # Our proof still goes out, best effort: then the peer logs the real
                    # reason (a wrong key) rather than "closed during the handshake".
                    with contextlib.suppress(trio.BrokenResourceError, OSError):
                        if outgoing := machine.data_to_send():
                            await stream.send_all(outgoing)
                    raise
                if outgoing := machine.data_to_send():
                    await stream.send_all(outgoing)
    except trio.TooSlowError:
        raise HandshakeError(
            f"no complete handshake within {timeout} s", reason="timeout"
        ) from None
    except (trio.BrokenResourceError, OSError) as exc:
        raise HandshakeError(
            f"connection failed during the handshake: {exc!r}", reason="broken"
        ) from None
    return machine.result
