"""Frames sealed in transit: ChaCha20-Poly1305 records over a trio stream, after the handshake.

What Spark users expect from `spark.network.crypto.enabled`: nobody on the path reads a
payload, and a byte altered, a record replayed, dropped or reordered ends the connection.

- Keys: each direction has its own 256-bit key, derived (blake3 derive_key) from the
  handshake's session key, itself derived from the deployment key and both sides' fresh
  nonces: new keys on every connection, unknown to anyone without the deployment key.
- Nonces: a 96-bit counter per direction, starting at 0 and +1 per record, so a nonce
  never repeats under a key (a connection would need 2**64 records to wrap; it is closed
  first). Because the receiver expects the next counter, a replayed, dropped or reordered
  record fails to open, like an altered one.
- Records: a 4-byte big-endian length, then ciphertext and its 16-byte tag; at most
  RECORD_PLAINTEXT bytes of plaintext each, so a peer can make us buffer one record at
  most. The frames of episub.net.framing travel inside, split across records as needed.

`SealedStream` wraps the handshaken stream and is itself a stream, so the connection's
reader and writer do not change. A record that fails raises SealError, a FrameError: the
connection is closed with that reason logged, as for any invalid frame.
"""

from __future__ import annotations

import struct

import blake3
import trio
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from episub.proto.wire import FrameError

__all__ = [
    "RECORD_PLAINTEXT",
    "RecordOpener",
    "RecordSealer",
    "SealError",
    "SealedStream",
    "direction_keys",
]

RECORD_PLAINTEXT = 64 * 1024  # bytes per record; = READ_CHUNK, so a frame costs few records
TAG_SIZE = 16  # Poly1305
MAX_RECORD = RECORD_PLAINTEXT + TAG_SIZE
READ_CHUNK = 64 * 1024
MAX_COUNTER = 2**64  # records per direction before the connection must end
_LENGTH = struct.Struct(">I")
KEY_CONTEXT = "episub 2026 sealed records v1 {}"  # blake3 derive_key context, per direction


class SealError(FrameError):
    """A sealed record that does not open: altered, replayed, reordered or oversized."""


def direction_keys(session_key: bytes, *, initiator: bool) -> tuple[bytes, bytes]:
    """(our sending key, our receiving key) for one side of a connection."""
    to_responder = blake3.blake3(session_key, derive_key_context=KEY_CONTEXT.format("I->R"))
    to_initiator = blake3.blake3(session_key, derive_key_context=KEY_CONTEXT.format("R->I"))
    keys = (to_responder.digest(), to_initiator.digest())
    return keys if initiator else (keys[1], keys[0])


class RecordSealer:
    """One direction's sending side, sans-IO: `seal(plaintext)` gives the records to write."""

    __slots__ = ("_aead", "_counter")

    def __init__(self, key: bytes) -> None:
        self._aead = ChaCha20Poly1305(key)
        self._counter = 0

    def seal(self, data: bytes | bytearray | memoryview) -> bytes | bytearray:
        """`data` as records of at most RECORD_PLAINTEXT bytes of plaintext each. Several
        are encrypted straight into one buffer: a megabyte sealed by slicing and joining
        cost ~4 times the encryption itself in copies and fresh allocations."""
        if len(data) <= RECORD_PLAINTEXT:  # one record: most writes
            return self._record(bytes(data))
        view = memoryview(data)
        size = len(view)
        records = -(-size // RECORD_PLAINTEXT)
        counter = self._counter
        if counter + records > MAX_COUNTER:
            raise trio.BrokenResourceError("nonce space used up: the connection must end")
        out = bytearray(size + records * (_LENGTH.size + TAG_SIZE))
        into = memoryview(out)
        pos = 0
        for start in range(0, size, RECORD_PLAINTEXT):
            chunk = view[start : start + RECORD_PLAINTEXT]
            sealed_size = len(chunk) + TAG_SIZE
            _LENGTH.pack_into(out, pos, sealed_size)
            pos += _LENGTH.size
            self._aead.encrypt_into(
                counter.to_bytes(12, "big"), chunk, None, into[pos : pos + sealed_size]
            )
            pos += sealed_size
            counter += 1
        self._counter = counter
        return out

    def _record(self, chunk: bytes) -> bytes:
        counter = self._counter
        if counter >= MAX_COUNTER:
            raise trio.BrokenResourceError("nonce space used up: the connection must end")
        sealed = self._aead.encrypt(counter.to_bytes(12, "big"), chunk, None)
        self._counter = counter + 1
        return _LENGTH.pack(len(sealed)) + sealed


class RecordOpener:
    """One direction's receiving side, sans-IO: `feed(received)` gives the plaintext of every
    record now complete; SealError for one that does not open."""

    __slots__ = ("_aead", "_counter", "_sealed")

    def __init__(self, key: bytes) -> None:
        self._aead = ChaCha20Poly1305(key)
        self._counter = 0
        self._sealed = bytearray()  # received, not yet opened: at most one record

    @property
    def buffered(self) -> int:
        """Bytes of an unfinished record held."""
        return len(self._sealed)

    def feed(self, data: bytes | bytearray) -> bytes:
        sealed = self._sealed
        if sealed:
            sealed += data
            buffer: bytes | bytearray = sealed
        else:
            buffer = data  # nothing held: read the records out of `data` itself
        pos, end = 0, len(buffer)
        plain: list[bytes] = []
        while end - pos >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(buffer, pos)
            if not TAG_SIZE < length <= MAX_RECORD:
                raise SealError(
                    f"sealed record of {length} bytes announced; they are "
                    f"{TAG_SIZE + 1}..{MAX_RECORD} (a peer without encryption?)"
                )
            stop = pos + _LENGTH.size + length
            if stop > end:
                break
            try:
                record = bytes(buffer[pos + _LENGTH.size : stop])
                plain.append(self._aead.decrypt(self._counter.to_bytes(12, "big"), record, None))
            except InvalidTag:
                raise SealError(
                    f"sealed record {self._counter} does not open: altered, "
                    "replayed or reordered in transit"
                ) from None
            self._counter += 1
            pos = stop
        if buffer is sealed:
            del sealed[:pos]
        elif pos < end:
            sealed += memoryview(data)[pos:]
        if len(plain) == 1:
            return plain[0]
        return b"".join(plain)


class SealedStream(trio.abc.HalfCloseableStream):
    """`stream`'s bytes sealed; `received` is what followed the handshake (sealed too)."""

    def __init__(
        self,
        stream: trio.abc.HalfCloseableStream,
        *,
        send_key: bytes,
        receive_key: bytes,
        received: bytes = b"",
    ) -> None:
        self.transport = stream
        self._sealer = RecordSealer(send_key)
        self._opener = RecordOpener(receive_key)
        self._received = received  # sealed bytes that came with the handshake
        self._plain = bytearray()  # opened, not yet handed out
        self.bytes_received = len(received)  # on the wire, tags and lengths included

    # -- sending ------------------------------------------------------------------------------

    def seal(self, data: bytes) -> bytes | bytearray:
        """`data` as records (sans-IO; send_all sends what this returns)."""
        return self._sealer.seal(data)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            await self.transport.send_all(self.seal(bytes(data)))

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.transport.send_eof()

    # -- receiving ----------------------------------------------------------------------------

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._received:
            self._plain += self._opener.feed(self._received)
            self._received = b""
        while not self._plain:
            data = await self.transport.receive_some(READ_CHUNK)
            if not data:
                if self._opener.buffered:
                    raise SealError(
                        f"connection closed inside a sealed record ({self._opener.buffered} bytes)"
                    )
                break
            self.bytes_received += len(data)
            self._plain += self._opener.feed(data)
        size = len(self._plain) if max_bytes is None else min(max_bytes, len(self._plain))
        out = bytes(self._plain[:size])
        del self._plain[:size]
        return out

    async def aclose(self) -> None:
        await self.transport.aclose()
