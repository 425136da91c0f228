"""Signed publishing (opt-in): an Ed25519 identity per node, its publisher id bound to it.

The deployment key makes a node a member; it does not stop one member from speaking for
another (a forged GOSSIP under another node's publisher id silenced that publisher at
every subscriber). With signing on:

- **Identity.** Each node run draws an Ed25519 key pair (`Signer.generate`), kept in
  memory only; like the peer id, it is new on every start, since a restarted node's
  sequence numbers start again at 0.
- **Binding.** A signing node's peer id ends in a tag derived from its public key:
  `host:port/` + 32 hex characters, the first 16 bytes of blake3 (derive_key mode,
  `TAG_CONTEXT`) of the key. Another key gives another tag except with probability 2^-128,
  so a member cannot find a key for someone else's id. (An unsigned node's tag is 16 random
  hex characters; the lengths never meet.) The handshake checks the binding for the peer
  at the other end of a connection (episub/net/handshake.py); this module checks it for
  every message's publisher, wherever it was relayed from.
- **What is signed.** The 32-byte message id, behind `MESSAGE_DOMAIN`. The id is blake3 of
  the canonical envelope (envelope.py): topic, publisher, seq, timestamp, key, headers and
  payload, so signing it binds them all, and a node checks the id against the envelope
  before it checks the signature. Ed25519 over 60 bytes costs the same whatever the
  payload's size. The envelope carries the signer's public key (32 bytes) and the
  signature (64 bytes); neither is part of the id.
- **Verified once, on first receipt**, after the cheap checks (size, duplicate, id) and
  before the message enters the store or ordering. A node's message that is
  unsigned, signed by a key its publisher id is not bound to, or whose signature does not
  verify is dropped and counted (`bad_signatures`); its sender misbehaved, since every
  signing node verifies before it forwards.
- **Named streams are not signed.** A publisher id ending in `/` and 32 lowercase hex
  characters is a signing node's own stream, and the rules above hold for it. Any other
  publisher id is a named stream (the Spark sink's `sink/<query>/<batch>/<partition>`,
  written by whichever executor runs the task, and again by another on a retry): it is
  bound to no key, any member may write any place of it, and a signature by whatever key
  the writer chose would prove nothing (any member, or anyone able to inject into an
  unsealed connection, can make a fresh key and sign with it). So named-stream messages
  are neither signed nor checked, and cost nothing; they are as safe as without signing:
  only members can write them, and the first message at a place wins. A node refuses to
  publish at a stream named like another node's id.

No I/O, no clock; `Signer.generate` draws from the OS (`Ed25519PrivateKey.generate`) and is
called by the runtime's owner (episub.node), never by the core.
"""

from __future__ import annotations

import blake3
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from episub.proto.errors import LocalProtocolError
from episub.proto.messages import (
    PUBLIC_KEY_SIZE,
    SIGNATURE_SIZE,
    Envelope,
    MessageId,
    PeerId,
    Signature,
)

__all__ = [
    "BOUND_TAG_HEX_CHARS",
    "MESSAGE_DOMAIN",
    "PUBLIC_KEY_SIZE",
    "SIGNATURE_SIZE",
    "TAG_CONTEXT",
    "Signer",
    "bound_tag",
    "check_message",
    "claimed_tag",
    "verify",
]

TAG_CONTEXT = "episub 2026 node signing key to peer id tag v1"  # blake3 derive_key context
BOUND_TAG_HEX_CHARS = 32  # 128 bits: finding a key for a given tag takes ~2^128 tries
MESSAGE_DOMAIN = b"episub message id v1\x00"  # what a message signature signs, before the id
_HEX = frozenset(b"0123456789abcdef")


def bound_tag(public_key: bytes) -> bytes:
    """The peer id tag a signing node with this public key must carry (32 hex, ASCII)."""
    hasher = blake3.blake3(public_key, derive_key_context=TAG_CONTEXT)
    return hasher.hexdigest(length=BOUND_TAG_HEX_CHARS // 2).encode("ascii")


def claimed_tag(publisher: PeerId) -> bytes | None:
    """The bound tag `publisher` claims (it ends in "/" and 32 lowercase hex characters: a
    signing node's own stream), else None (a named stream, or an unsigned node's id)."""
    if not isinstance(publisher, bytes) or len(publisher) <= BOUND_TAG_HEX_CHARS:
        return None
    tag = publisher[-BOUND_TAG_HEX_CHARS:]
    if publisher[-BOUND_TAG_HEX_CHARS - 1] != ord("/") or not _HEX.issuperset(tag):
        return None
    return tag


def verify(public_key: bytes, signature: bytes, data: bytes) -> bool:
    """Does `signature` by `public_key` (both raw, 32 and 64 bytes) sign `data`?"""
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


def check_message(mid: MessageId, envelope: Envelope) -> str | None:
    """Why a received message must be dropped with signing on, or None if it may enter
    (a named stream's always may). `mid` has been checked against the envelope already."""
    tag = claimed_tag(envelope.publisher)
    if tag is None:
        return None  # a named stream: bound to no key (see the module's docstring)
    signature = envelope.signature
    if signature is None:
        return "is not signed"
    if tag != bound_tag(signature.signer):
        return "is signed by a key its publisher id is not bound to"
    if not verify(signature.signer, signature.value, MESSAGE_DOMAIN + mid):
        return "has a signature that does not verify"
    return None


class Signer:
    """This node's signing identity: its Ed25519 private key, in memory only."""

    __slots__ = ("_private", "public_key", "tag")

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private = private_key
        self.public_key = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.tag = bound_tag(self.public_key)

    @classmethod
    def generate(cls) -> Signer:
        """A fresh identity (the OS's randomness)."""
        return cls(Ed25519PrivateKey.generate())

    def __repr__(self) -> str:
        return f"Signer(tag={self.tag.decode()})"  # never the private key

    def sign(self, data: bytes) -> bytes:
        return self._private.sign(data)

    def binds(self, peer_id: PeerId) -> bool:
        """Is `peer_id` bound to this identity (its tag derived from our public key)?"""
        return claimed_tag(peer_id) == self.tag

    def sign_message(self, mid: MessageId, envelope: Envelope) -> Envelope:
        """`envelope` with our signature of `mid` (its id) if it is of our own stream; a
        named stream's as it is. LocalProtocolError if its publisher claims another
        node's id: nobody would accept it."""
        tag = claimed_tag(envelope.publisher)
        if tag is None:
            return envelope  # a named stream: not signed (see the module's docstring)
        if tag != self.tag:
            raise LocalProtocolError(
                f"publisher {envelope.publisher!r} looks like another signing node's id "
                "(it ends in '/' and 32 hex characters): name the stream otherwise"
            )
        value = self._private.sign(MESSAGE_DOMAIN + mid)
        signature = Signature(signer=self.public_key, value=value)
        return envelope.signed(signature)
