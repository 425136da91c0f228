"""Message identity: the id of a message is blake3 over a canonical encoding of its envelope.

The encoding is ours, not protobuf's, because protobuf does not promise byte-identical
serialisation across implementations; a receiver recomputes the id from the fields it
decoded, so the id checks the fields, not the bytes they arrived in.

Layout: a version byte, then each field length-prefixed (u32 big-endian) in a fixed order:
topic, publisher, seq (u64), timestamp_ms (u64), key-present flag + key, headers count +
(name, value) pairs, payload. The signature (signed publishing) is left out: it signs
the id (signing.py).
"""

from __future__ import annotations

import struct

import blake3

from episub.proto.messages import Envelope, MessageId, PeerId

_ENCODING_VERSION = b"\x01"
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


def encode_peer_id(peer: PeerId) -> bytes:
    """Canonical bytes of a peer id: `bytes` as they are, an `int` (simulator) as 8 bytes."""
    if isinstance(peer, bytes):
        return peer
    if isinstance(peer, int) and not isinstance(peer, bool) and 0 <= peer < 1 << 64:
        return b"\x00sim" + _U64.pack(peer)
    raise TypeError(f"peer id must be bytes or a non-negative int, not {peer!r}")


def _field(data: bytes) -> bytes:
    return _U32.pack(len(data)) + data


def encode_envelope(topic: str, envelope: Envelope) -> bytes:
    parts = [
        _ENCODING_VERSION,
        _field(topic.encode()),
        _field(encode_peer_id(envelope.publisher)),
        _U64.pack(envelope.seq),
        _U64.pack(envelope.timestamp_ms),
    ]
    if envelope.key is None:
        parts.append(b"\x00")
    else:
        parts.append(b"\x01" + _field(envelope.key))
    parts.append(_U32.pack(len(envelope.headers)))
    for name, value in envelope.headers:
        parts.append(_field(name.encode()) + _field(value))
    parts.append(_field(envelope.payload))
    return b"".join(parts)


def message_id(topic: str, envelope: Envelope, key: bytes | None = None) -> MessageId:
    """blake3 of the canonical envelope; keyed mode when the deployment has a 32-byte key."""
    hasher = blake3.blake3(key=key) if key is not None else blake3.blake3()
    hasher.update(encode_envelope(topic, envelope))
    return hasher.digest()
