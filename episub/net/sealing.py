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

__all__ = ["RECORD_PLAINTEXT", "SealError", "SealedStream", "direction_keys"]

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


def _nonce(counter: int) -> bytes:
    return counter.to_bytes(12, "big")


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
        self._seal = ChaCha20Poly1305(send_key)
        self._open = ChaCha20Poly1305(receive_key)
        self._send_counter = 0
        self._receive_counter = 0
        self._sealed = bytearray(received)  # received, not yet opened
        self._plain = bytearray()  # opened, not yet handed out
        self._ended = False
        self.bytes_received = len(received)  # on the wire, tags and lengths included

    # -- sending ------------------------------------------------------------------------------

    def seal(self, data: bytes) -> bytes:
        """`data` as records (sans-IO; send_all sends what this returns)."""
        out = bytearray()
        view = memoryview(data)
        for start in range(0, len(view), RECORD_PLAINTEXT):
            if self._send_counter >= MAX_COUNTER:
                raise trio.BrokenResourceError("nonce space used up: the connection must end")
            chunk = view[start : start + RECORD_PLAINTEXT]
            sealed = self._seal.encrypt(_nonce(self._send_counter), bytes(chunk), None)
            self._send_counter += 1
            out += _LENGTH.pack(len(sealed))
            out += sealed
        return bytes(out)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            await self.transport.send_all(self.seal(bytes(data)))

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.transport.send_eof()

    # -- receiving ----------------------------------------------------------------------------

    def open_records(self) -> None:
        """Open every whole record received (sans-IO); SealError if one fails."""
        while len(self._sealed) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._sealed)
            if not TAG_SIZE < length <= MAX_RECORD:
                raise SealError(
                    f"sealed record of {length} bytes announced; they are "
                    f"{TAG_SIZE + 1}..{MAX_RECORD} (a peer without encryption?)"
                )
            end = _LENGTH.size + length
            if len(self._sealed) < end:
                return
            record = bytes(self._sealed[_LENGTH.size : end])
            try:
                plain = self._open.decrypt(_nonce(self._receive_counter), record, None)
            except InvalidTag:
                raise SealError(
                    f"sealed record {self._receive_counter} does not open: altered, "
                    "replayed or reordered in transit"
                ) from None
            del self._sealed[:end]
            self._receive_counter += 1
            self._plain += plain

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        while not self._plain:
            self.open_records()
            if self._plain or self._ended:
                break
            data = await self.transport.receive_some(READ_CHUNK)
            if not data:
                self._ended = True
                if self._sealed:
                    raise SealError(
                        f"connection closed inside a sealed record ({len(self._sealed)} bytes)"
                    )
                break
            self.bytes_received += len(data)
            self._sealed += data
        size = len(self._plain) if max_bytes is None else min(max_bytes, len(self._plain))
        out = bytes(self._plain[:size])
        del self._plain[:size]
        return out

    async def aclose(self) -> None:
        await self.transport.aclose()
