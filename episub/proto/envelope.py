"""What a publisher stamps on a message, and the message's identity.

An `Envelope` is its canonical bytes: the protobuf encoding of episub.proto's `Envelope`
with fields in number order, each at most once (headers, repeated, in order), proto3
defaults left out, varints minimal and nothing else. That is what protobuf's own
serialiser writes for those fields, so the bytes are a protobuf message any implementation
reads; and it is the only encoding `Envelope.decode` accepts, so bytes and fields are one
to one. Hence:

- A GOSSIP carries the envelope's bytes as they were stamped, and every node forwards
  and stores those very bytes (no re-encoding on the way).
- The message id is blake3 over a topic prefix and those bytes up to the signature
  (`message_id`; keyed only where a NodeConfig sets `id_key`): a receiver checks it on
  the bytes it got, without encoding anything, and the id names the fields as well as the
  bytes. Signed publishing (signing.py) appends fields 7 and 8, the signer's public key
  and its signature of the id: they come last and are not part of the id.

Bounds checked once, where an envelope is made: by the constructor (the API's publish) or
by `decode` (the wire). Decoding raises ValueError for anything else; the caller (a GOSSIP's
first receipt, broadcast.py) reports the peer.
"""

from __future__ import annotations

import struct
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

import blake3

__all__ = [
    "ID_VERSION",
    "MAX_HEADERS",
    "MAX_SEQ",
    "MAX_STREAM_NAME",
    "MAX_TIMESTAMP_MS",
    "PUBLIC_KEY_SIZE",
    "SIGNATURE_SIZE",
    "Envelope",
    "IdHasher",
    "Record",
    "Signature",
    "check_given_stamp",
    "check_stream_seq",
    "encode_peer_id",
    "message_id",
]

PeerId: TypeAlias = Hashable
MessageId: TypeAlias = bytes

MAX_HEADERS = 64  # Kafka-style record headers one message may carry
PUBLIC_KEY_SIZE = 32  # Ed25519's (signing.py)
SIGNATURE_SIZE = 64  # Ed25519's
MAX_SEQ = (1 << 63) - 1  # the largest seq: signed 64-bit in most consumers (Kafka's offsets)
MAX_TIMESTAMP_MS = (1 << 63) - 1  # the largest timestamp_ms, for the same reason
MAX_STREAM_NAME = 64  # = wire.MAX_PEER_ID_SIZE: a named stream travels as a peer id
# The version of the id's layout: blake3(ID_VERSION, u32 topic length, topic, envelope bytes).
ID_VERSION = b"\x02"
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

# Tags (field number << 3 | wire type) of the Envelope and Header messages (episub.proto).
_PUBLISHER, _SEQ, _TIMESTAMP, _PAYLOAD, _KEY, _HEADER = 0x0A, 0x10, 0x18, 0x22, 0x2A, 0x32
_SIGNER, _SIGNATURE = 0x3A, 0x42
_NAME, _VALUE = 0x0A, 0x12


def encode_peer_id(peer: PeerId) -> bytes:
    """Canonical bytes of a peer id: `bytes` as they are, an `int` (simulator) as 12 bytes."""
    if isinstance(peer, bytes):
        return peer
    if isinstance(peer, int) and not isinstance(peer, bool) and 0 <= peer < 1 << 64:
        return b"\x00sim" + _U64.pack(peer)
    raise TypeError(f"peer id must be bytes or a non-negative int, not {peer!r}")


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Varints of the lengths and counts that nearly every message has, made once.
_SMALL_VARINTS = tuple(_varint(value) for value in range(1 << 14))


def varint(value: int) -> bytes:
    """`value` (0 <= value < 2**64) as a protobuf varint."""
    if value < 16384:
        return _SMALL_VARINTS[value]
    return _varint(value)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The minimal varint at data[pos:] and the position after it; ValueError otherwise."""
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    value = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0:
                raise ValueError("varint is not minimal")
            if value >= 1 << 64:
                raise ValueError("varint exceeds 64 bits")
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _field(tag: int, data: bytes) -> bytes:
    return bytes((tag,)) + varint(len(data)) + data


@dataclass(frozen=True, slots=True, kw_only=True)
class Signature:
    """A message's signature (signing.py): the signer's Ed25519 public key, and its
    signature of the message id."""

    signer: bytes
    value: bytes

    def __post_init__(self) -> None:
        if len(self.signer) != PUBLIC_KEY_SIZE:
            raise ValueError(f"signer key must be {PUBLIC_KEY_SIZE} bytes, not {len(self.signer)}")
        if len(self.value) != SIGNATURE_SIZE:
            raise ValueError(f"signature must be {SIGNATURE_SIZE} bytes, not {len(self.value)}")


class Envelope:
    """A publisher's message: publisher, seq, timestamp_ms, payload, key, headers, and with
    signed publishing its `signature` of the id.

    Immutable by convention (slots, no setters). `raw` is the canonical encoding, `unsigned`
    its part before the signature (what the id is over), `size` the application's bytes
    (payload, key, headers): what size limits apply to. Two envelopes are equal when their
    bytes are."""

    __slots__ = (
        "_payload_span",
        "_unsigned_end",
        "headers",
        "key",
        "publisher",
        "raw",
        "seq",
        "signature",
        "size",
        "timestamp_ms",
    )

    publisher: PeerId
    seq: int
    timestamp_ms: int
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    raw: bytes
    size: int
    signature: Signature | None
    _payload_span: tuple[int, int]
    _unsigned_end: int

    def __init__(
        self,
        *,
        publisher: PeerId,
        seq: int,
        timestamp_ms: int,
        payload: bytes,
        key: bytes | None = None,
        headers: tuple[tuple[str, bytes], ...] = (),
        signature: Signature | None = None,
    ) -> None:
        if not isinstance(seq, int) or not 0 <= seq <= MAX_SEQ:
            raise ValueError(f"seq must be a non-negative 63-bit int, not {seq!r}")
        if not isinstance(timestamp_ms, int) or not 0 <= timestamp_ms <= MAX_TIMESTAMP_MS:
            raise ValueError(f"timestamp_ms must be a non-negative int, not {timestamp_ms!r}")
        if not isinstance(payload, bytes):
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        if key is not None and not isinstance(key, bytes):
            raise TypeError(f"key must be bytes or None, not {type(key).__name__}")
        headers = tuple(headers)
        if len(headers) > MAX_HEADERS:
            raise ValueError(f"at most {MAX_HEADERS} headers, not {len(headers)}")
        for header in headers:
            if not (
                isinstance(header, tuple)
                and len(header) == 2
                and isinstance(header[0], str)
                and isinstance(header[1], bytes)
            ):
                raise TypeError(f"a header is a (str, bytes) pair, not {header!r:.80}")
        self._encode(publisher, seq, timestamp_ms, payload, key, headers, signature)

    @classmethod
    def stamp(cls, record: Record, publisher: PeerId, seq: int, timestamp_ms: int) -> Envelope:
        """`record` (checked when it was made) stamped with its place and time: what a
        publish makes, without checking the record's fields again. `seq` and
        `timestamp_ms` are the core's own (or the record's checked stream place)."""
        envelope = cls.__new__(cls)
        envelope._encode(
            publisher, seq, timestamp_ms, record.value, record.key, record.headers, None
        )
        return envelope

    def _encode(
        self,
        publisher: PeerId,
        seq: int,
        timestamp_ms: int,
        payload: bytes,
        key: bytes | None,
        headers: tuple[tuple[str, bytes], ...],
        signature: Signature | None,
    ) -> None:
        parts = [_field(_PUBLISHER, encode_peer_id(publisher))]
        if seq:
            parts.append(b"\x10" + varint(seq))
        if timestamp_ms:
            parts.append(b"\x18" + varint(timestamp_ms))
        size = len(payload)
        if payload:
            parts.append(bytes((_PAYLOAD,)) + varint(size))
            start = sum(map(len, parts))
            parts.append(payload)
        else:
            start = sum(map(len, parts))
        span = (start, start + len(payload))
        if key is not None:
            parts.append(_field(_KEY, key))
            size += len(key)
        for name, value in headers:
            encoded = name.encode()
            body = (_field(_NAME, encoded) if encoded else b"") + (
                _field(_VALUE, value) if value else b""
            )
            parts.append(_field(_HEADER, body))
            size += len(name) + len(value)
        unsigned_end = sum(map(len, parts))
        if signature is not None:
            parts.append(_field(_SIGNER, signature.signer) + _field(_SIGNATURE, signature.value))
        self.publisher = publisher
        self.seq = seq
        self.timestamp_ms = timestamp_ms
        self.key = key
        self.headers = headers
        self.signature = signature
        self.raw = b"".join(parts)
        self.size = size
        self._payload_span = span
        self._unsigned_end = unsigned_end

    @property
    def unsigned(self) -> bytes | memoryview:
        """The bytes before the signature: what the message id is over. `raw` itself when
        there is no signature (most messages): blake3 reads bytes faster than a view."""
        raw = self.raw
        end = self._unsigned_end
        return raw if end == len(raw) else memoryview(raw)[:end]

    def signed(self, signature: Signature) -> Envelope:
        """This envelope with `signature` (signing.py), in place of any it had."""
        return self.replace(signature=signature)

    def replace(self, **changes: object) -> Envelope:
        """A new envelope with `changes` to its fields (as dataclasses.replace does)."""
        fields: dict[str, object] = {
            "publisher": self.publisher, "seq": self.seq, "timestamp_ms": self.timestamp_ms,
            "payload": self.payload, "key": self.key, "headers": self.headers,
            "signature": self.signature,
        }  # fmt: skip
        unknown = set(changes) - set(fields)
        if unknown:
            raise TypeError(f"Envelope has no field {sorted(unknown)[0]!r}")
        return Envelope(**{**fields, **changes})  # type: ignore[arg-type]

    @property
    def payload(self) -> bytes:
        start, end = self._payload_span
        return self.raw[start:end]

    @classmethod
    def decode(cls, raw: bytes) -> Envelope:
        """The envelope whose canonical encoding `raw` is; ValueError for any other bytes."""
        try:
            return cls._decode(raw)
        except IndexError:
            raise ValueError("envelope ends inside a field") from None

    @classmethod
    def _decode(cls, raw: bytes) -> Envelope:
        end = len(raw)
        if not end or raw[0] != _PUBLISHER:
            raise ValueError("envelope does not start with its publisher")
        size = raw[1]  # a one-byte varint in line: the usual case
        if size < 0x80:
            pos = 2
        else:
            size, pos = read_varint(raw, 1)
        if not size or pos + size > end:
            raise ValueError("envelope's publisher is empty or cut short")
        publisher = raw[pos : pos + size]
        pos += size
        seq = timestamp_ms = 0
        key = None
        headers: list[tuple[str, bytes]] = []
        span = (pos, pos)
        tag = raw[pos] if pos < end else -1
        if tag == _SEQ:
            seq = raw[pos + 1]  # a one- or two-byte varint in line: the usual cases
            if seq < 0x80:
                pos += 2
            elif 0 < (high := raw[pos + 2]) < 0x80:  # (a high byte 0 is not minimal)
                seq = (seq & 0x7F) | (high << 7)
                pos += 3
            else:
                seq, pos = read_varint(raw, pos + 1)
            if not 0 < seq <= MAX_SEQ:
                raise ValueError(f"seq must be 1..2**63-1 when present, not {seq}")
            tag = raw[pos] if pos < end else -1
        if tag == _TIMESTAMP:
            timestamp_ms, pos = read_varint(raw, pos + 1)
            if not 0 < timestamp_ms <= MAX_TIMESTAMP_MS:
                raise ValueError(f"timestamp_ms must be 1..2**63-1 if present, not {timestamp_ms}")
            tag = raw[pos] if pos < end else -1
        app_size = 0
        if tag == _PAYLOAD:
            size = raw[pos + 1]  # a one- or two-byte varint in line: the usual cases
            if size < 0x80:
                pos += 2
            elif 0 < (high := raw[pos + 2]) < 0x80:
                size = (size & 0x7F) | (high << 7)
                pos += 3
            else:
                size, pos = read_varint(raw, pos + 1)
            if not size or pos + size > end:
                raise ValueError("envelope's payload is empty or cut short")
            span = (pos, pos + size)
            app_size = size
            pos += size
            tag = raw[pos] if pos < end else -1
        if tag == _KEY:
            size = raw[pos + 1]  # a one-byte varint in line: the usual case
            if size < 0x80:
                pos += 2
            else:
                size, pos = read_varint(raw, pos + 1)
            if pos + size > end:
                raise ValueError("envelope's key is cut short")
            key = raw[pos : pos + size]
            app_size += size
            pos += size
            tag = raw[pos] if pos < end else -1
        while tag == _HEADER:
            if len(headers) >= MAX_HEADERS:
                raise ValueError(f"at most {MAX_HEADERS} headers")
            size, pos = read_varint(raw, pos + 1)
            stop = pos + size
            if stop > end:
                raise ValueError("envelope's header is cut short")
            name, value = "", b""
            if pos < stop and raw[pos] == _NAME:
                length, pos = read_varint(raw, pos + 1)
                if not length or pos + length > stop:
                    raise ValueError("header name is empty or cut short")
                name = raw[pos : pos + length].decode()  # UnicodeDecodeError is a ValueError
                pos += length
            if pos < stop and raw[pos] == _VALUE:
                length, pos = read_varint(raw, pos + 1)
                if not length or pos + length > stop:
                    raise ValueError("header value is empty or cut short")
                value = raw[pos : pos + length]
                pos += length
            if pos != stop:
                raise ValueError("header carries fields out of order or unknown")
            headers.append((name, value))
            app_size += len(name) + len(value)
            tag = raw[pos] if pos < end else -1
        unsigned_end = pos
        signature = None
        if tag == _SIGNER:
            size, pos = read_varint(raw, pos + 1)
            signer = raw[pos : pos + size]
            pos += size
            if pos >= end or raw[pos] != _SIGNATURE:
                raise ValueError("envelope has a signer but no signature")
            size, pos = read_varint(raw, pos + 1)
            signature = Signature(signer=signer, value=raw[pos : pos + size])  # checks sizes
            pos += size
        if pos != end:
            raise ValueError("envelope carries fields out of order, repeated or unknown")
        envelope = cls.__new__(cls)
        envelope.publisher = publisher
        envelope.seq = seq
        envelope.timestamp_ms = timestamp_ms
        envelope.key = key
        envelope.headers = tuple(headers)
        envelope.signature = signature
        envelope.raw = raw
        envelope.size = app_size
        envelope._payload_span = span
        envelope._unsigned_end = unsigned_end
        return envelope

    def __eq__(self, other: object) -> bool:
        if type(other) is not Envelope:
            return NotImplemented
        return self.raw == other.raw and self.publisher == other.publisher

    def __hash__(self) -> int:
        return hash(self.raw)

    def __repr__(self) -> str:
        return (
            f"Envelope(publisher={self.publisher!r}, seq={self.seq!r}, "
            f"timestamp_ms={self.timestamp_ms!r}, payload={self.payload!r:.60}, "
            f"key={self.key!r}, headers={self.headers!r}, signature={self.signature!r})"
        )

    def __reduce__(self) -> tuple[object, ...]:
        fields = (self.publisher, self.seq, self.timestamp_ms, self.payload, self.key)
        return (_rebuild, (*fields, self.headers, self.signature))


def _rebuild(
    publisher: PeerId,
    seq: int,
    timestamp_ms: int,
    payload: bytes,
    key: bytes | None,
    headers: tuple[tuple[str, bytes], ...],
    signature: Signature | None,
) -> Envelope:
    return Envelope(
        publisher=publisher, seq=seq, timestamp_ms=timestamp_ms, payload=payload, key=key,
        headers=headers, signature=signature,
    )  # fmt: skip


class Record:
    """One message to publish, as the application hands it over: `value`, `key`,
    `headers`, and optionally `stream` = (publisher, seq), a place of a stream the caller
    names, with its stamp `timestamp_ms` (see `Node.publish_record`).

    Checked here, once, where it enters (the node's API, the agent's request), and trusted
    after: the core stamps it into an `Envelope` without checking it again. Bytes-like
    values become `bytes`; `size` is what size limits apply to (value, key, header names
    and values). Raises TypeError for a wrong type, ValueError for a bad value, naming it.
    """

    __slots__ = ("headers", "key", "size", "stream", "timestamp_ms", "value")

    value: bytes
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    stream: tuple[bytes, int] | None
    timestamp_ms: int | None
    size: int

    def __init__(
        self,
        value: bytes,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None = None,
        stream: tuple[bytes, int] | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        self.value = value = _as_bytes("value", value)
        self.key = key = None if key is None else _as_bytes("key", key)
        size = len(value) + (0 if key is None else len(key))
        if headers:
            self.headers = _checked_headers(headers)
            size += sum(len(name) + len(value) for name, value in self.headers)
        else:
            self.headers = ()
        self.size = size
        if stream is not None:
            stream = _checked_stream(stream)
        self.stream = stream
        if timestamp_ms is not None:
            check_given_stamp(timestamp_ms, named=stream is not None)
        self.timestamp_ms = timestamp_ms

    def __eq__(self, other: object) -> bool:
        if type(other) is not Record:
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def _fields(self) -> tuple[object, ...]:
        return (self.value, self.key, self.headers, self.stream, self.timestamp_ms)

    def __repr__(self) -> str:
        return (
            f"Record(value={self.value!r:.60}, key={self.key!r:.40}, headers={self.headers!r:.80}, "
            f"stream={self.stream!r}, timestamp_ms={self.timestamp_ms!r})"
        )


def _as_bytes(name: str, value: object) -> bytes:
    if type(value) is bytes:
        return value  # type: ignore[return-value]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    hint = " (encode it first)" if isinstance(value, str) else ""
    raise TypeError(f"{name} must be bytes, not {type(value).__name__}{hint}: {value!r:.80}")


def _checked_headers(
    headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]],
) -> tuple[tuple[str, bytes], ...]:
    pairs = list(headers.items() if isinstance(headers, Mapping) else headers)
    if len(pairs) > MAX_HEADERS:
        raise ValueError(f"at most {MAX_HEADERS} headers, not {len(pairs)}")
    out = []
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise TypeError(f"a header is a (str, bytes) pair, not {pair!r:.80}")
        name = pair[0]
        try:
            name.encode()
        except UnicodeEncodeError:
            raise ValueError(f"header name {name!r:.80} is not encodable as UTF-8") from None
        out.append((name, _as_bytes(f"header {name!r:.40}", pair[1])))
    return tuple(out)


def _checked_stream(stream: object) -> tuple[bytes, int]:
    if not (isinstance(stream, tuple) and len(stream) == 2):
        raise TypeError(f"stream must be a (publisher, seq) pair, not {stream!r:.80}")
    publisher, seq = stream
    publisher = _as_bytes("a stream's publisher", publisher)
    if not 1 <= len(publisher) <= MAX_STREAM_NAME:
        raise ValueError(
            f"a stream's publisher must be 1..{MAX_STREAM_NAME} bytes, not {len(publisher)}"
        )
    check_stream_seq(seq)
    return publisher, seq


def check_stream_seq(seq: object) -> None:
    """A place's seq in a stream the caller names: an int in 0..MAX_SEQ."""
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= MAX_SEQ:
        raise ValueError(f"a stream's seq must be an int in 0..2**63-1, not {seq!r:.40}")


def check_given_stamp(timestamp_ms: object, *, named: bool) -> None:
    """A stamp the caller gives: only a `named` stream's place takes one (so that a place
    written twice is the same message), an int in 0..MAX_TIMESTAMP_MS."""
    if not named:
        raise ValueError("timestamp_ms is for a named stream's place; give stream= too")
    if (
        not isinstance(timestamp_ms, int)
        or isinstance(timestamp_ms, bool)
        or not 0 <= timestamp_ms <= MAX_TIMESTAMP_MS
    ):
        raise ValueError(f"timestamp_ms must be a 63-bit int, not {timestamp_ms!r:.40}")


class IdHasher:
    """Message ids of one topic: blake3 over the topic prefix, hashed once, then the
    envelope's bytes (keyed when the deployment has a 32-byte id key)."""

    __slots__ = ("_base",)

    def __init__(self, topic: str, key: bytes | None = None) -> None:
        encoded = topic.encode()
        prefix = ID_VERSION + _U32.pack(len(encoded)) + encoded
        self._base = blake3.blake3(prefix, key=key) if key is not None else blake3.blake3(prefix)

    def __call__(self, unsigned: bytes | memoryview) -> MessageId:
        """The id of the envelope whose bytes before the signature are `unsigned`."""
        hasher = self._base.copy()
        hasher.update(unsigned)
        return hasher.digest()


def message_id(topic: str, envelope: Envelope, key: bytes | None = None) -> MessageId:
    """The id of `envelope` on `topic` (see the module docstring)."""
    return IdHasher(topic, key)(envelope.unsigned)
