"""Helpers for the runtime's tests: real sockets on 127.0.0.1, driven with plain `trio.run`.

The tests are sync functions that call `run(async_fn)` (no pytest-trio): one trio run per
test, so every socket and task a test opens is closed by the time it returns, or trio
raises.

Synchronisation: trio events where the code under test offers one (a subscription's
next item); `wait_until(predicate)` polling where none exists (an overlay converging).
Timeouts only bound a wait, so a broken build fails instead of hanging; none of them is
a threshold a passing run depends on.

`RawPeer` is a hand-driven peer: a real TCP connection, our handshake (or none), then
whatever bytes a test chooses, to play a buggy or hostile node.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from episub.net.framing import READ_CHUNK
from episub.net.handshake import perform_handshake
from episub.net.peer_id import make_peer_id, parse_address
from episub.net.sealing import SealedStream, direction_keys
from episub.proto.config import BroadcastConfig, MembershipConfig, NodeConfig
from episub.proto.messages import PeerMessage
from episub.proto.signing import Signer
from episub.proto.wire import FrameDecoder, FrameError, encode_frame

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
TOPIC = "t"
WAIT = 20.0  # bound on any wait: a failing build stops here instead of hanging


class FrameReader:
    """A test peer's reader: whole frames of (topic, message) items from one stream, None
    at a clean end (a node reads its connections in episub/net/connection.py)."""

    def __init__(self, stream: trio.abc.ReceiveStream, *, max_frame_size: int) -> None:
        self._stream = stream
        self._decoder = FrameDecoder(max_frame_size=max_frame_size)
        self.bytes_received = 0

    def feed(self, data: bytes) -> None:
        """Bytes that arrived before the reader took over (what followed the handshake)."""
        self.bytes_received += len(data)
        self._decoder.feed(data)

    async def receive_frame(self) -> list[tuple[str | None, PeerMessage]] | None:
        """The next frame; None once the peer closed cleanly between frames.

        Raises FrameError for a bad frame, or for a stream that ends inside a frame.
        """
        while True:
            frame = self._decoder.next_frame()
            if frame is not None:
                return frame
            data = await self._stream.receive_some(READ_CHUNK)
            if not data:
                if self._decoder.buffered:
                    raise FrameError(
                        f"connection closed inside a frame ({self._decoder.buffered} bytes "
                        "of it received)"
                    )
                return None
            self.bytes_received += len(data)
            self._decoder.feed(data)


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    return trio.run(fn)


async def wait_until(
    predicate: Callable[[], bool], timeout: float = WAIT, what: str = "condition"
) -> None:
    """Poll `predicate` every 10 ms until true; fail after `timeout` seconds."""
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.01)
        return
    raise AssertionError(f"{what} not reached within {timeout} s")


def fast_config(**membership: Any) -> NodeConfig:
    """Protocol timers ~10x the defaults' pace, so overlays form in a second or two."""
    fields: dict[str, Any] = {
        "stabilize_interval": 0.2,
        "optimize_interval": 0.5,
        "shuffle_interval": 3.0,
        "ping_interval": 0.5,
        "passive_probe_interval": 0.2,
        "ping_timeout": 2.0,
        "neighbor_request_timeout": 1.0,
        "join_retry_interval": 0.5,
    }
    fields.update(membership)
    return NodeConfig(
        membership=MembershipConfig(**fields),
        broadcast=BroadcastConfig(stream_settle=0.2, gap_timeout=0.5, gap_retry_interval=0.2),
    )


def overlay_connected(active: dict[bytes, Sequence[bytes]]) -> bool:
    """Is the graph of active views (node -> its neighbours) one connected component?"""
    if not active:
        return False
    start = next(iter(active))
    seen = {start}
    frontier = [start]
    while frontier:
        node = frontier.pop()
        for peer in active.get(node, ()):
            if peer in active and peer not in seen:
                seen.add(peer)
                frontier.append(peer)
    return len(seen) == len(active)


class RawPeer:
    """A peer the test drives byte by byte over real TCP."""

    def __init__(self, stream: trio.SocketStream, peer_id: bytes, max_frame_size: int) -> None:
        self.transport = stream  # the TCP stream itself
        self.stream: trio.abc.HalfCloseableStream = stream  # sealed once handshaken
        self.id = peer_id
        self.max_frame_size = max_frame_size
        self.reader = FrameReader(stream, max_frame_size=max_frame_size)
        self.node_id: bytes | None = None  # learned in the handshake

    @classmethod
    async def connect(
        cls,
        address: str,
        *,
        key: bytes | None = KEY,
        receive_buffer: int | None = None,
        max_frame_size: int = 1 << 24,
        encrypt: bool = True,
        signer: Signer | None = None,
    ) -> RawPeer:
        """Connect to `address`; handshake with `key` unless it is None. After the
        handshake, `send`/`send_items` and `reader` go through sealed records (as a node's
        do) unless encrypt is False; `transport` is the bare TCP stream. With `signer`, the
        peer has that signing identity (and the id bound to it), for signing nodes."""
        target = parse_address(address)
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
        if receive_buffer is not None:  # a small window makes a slow reader quickly
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        await sock.connect((target.host, target.port))
        stream = trio.SocketStream(sock)
        tag = None if signer is None else signer.tag.decode()
        peer_id = make_peer_id("127.0.0.1", 1, tag)  # nobody listens on port 1: undialable
        raw = cls(stream, peer_id, max_frame_size)
        if key is not None:
            result = await perform_handshake(
                stream, key=key, my_id=peer_id, initiator=True, encrypt=encrypt, signer=signer
            )
            raw.node_id = result.peer_id
            if encrypt:
                send_key, receive_key = direction_keys(result.session_key, initiator=True)
                raw.stream = SealedStream(
                    stream,
                    send_key=send_key,
                    receive_key=receive_key,
                    received=result.trailing_data,
                )
                raw.reader = FrameReader(raw.stream, max_frame_size=max_frame_size)
            else:
                raw.reader.feed(result.trailing_data)
        return raw

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def send_items(self, items: Sequence[tuple[str | None, PeerMessage]]) -> None:
        await self.stream.send_all(encode_frame(items))

    async def wait_closed(self) -> None:
        """Read (and discard) until the node closes the connection."""
        try:
            while await self.transport.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass  # a reset is a close too

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)
