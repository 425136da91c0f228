"""One peer's send queue, and one authenticated connection's reader and writer tasks.

A `Peer` outlives its connections: its queue fills while a dial is in flight and is
drained by whichever connection is the peer's current one (`Peer.conn`). A `Connection`
is one TCP stream after its handshake; it runs a reader (frames in, to the runtime) and a
writer (queue out, in piggybacked frames), and with link-delay emulation a third task
that holds frames back before writing them, in order.

Batching, so that a message costs a few microseconds rather than a system call:
- The reader hands every whole frame of one read to the runtime at once.
- The writer, woken by a first queued item less than `GATHER_WAIT` after its last write
  (a burst, as Nagle's algorithm sees one), waits until every task of the process is
  blocked (trio.testing.wait_all_tasks_blocked: whatever was ready has run and queued
  what it had to say), at most `GATHER_WAIT`, or until `PIGGYBACK_BUDGET` bytes are
  queued. Then it writes everything queued, up to `WRITE_BUDGET`, as one sealed write.
  A message after a quiet spell goes out at once; a burst goes out in a few big writes.

How a connection ends, and what the runtime makes of it (`Connection.failure`,
`Connection.we_closed`):
- we stop writing (ClosePeer, a duplicate that lost, idle, shutdown): the writer drains
  what it must, sends EOF, and waits up to `CLOSE_LINGER` for the peer's EOF, reading and
  processing what the peer sent meanwhile. Nothing is reported to the core.
- the peer sends EOF between frames: the connection ends; the runtime decides whether that
  was a goodbye or a loss.
- anything else (a bad frame, a reset, EOF inside a frame, an abort): `failure` says what.

All tasks of a connection live in one cancel scope (`abort()` cancels it) inside the
task that serves the connection; the stream is closed when they are all done.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable

import trio
from trio.testing import wait_all_tasks_blocked

from episub.net.framing import PIGGYBACK_BUDGET, FrameReader, take_frames
from episub.net.sealing import SealedStream, direction_keys
from episub.proto.messages import Message
from episub.proto.wire import LENGTH_PREFIX_SIZE, FrameError

__all__ = ["CLOSE_LINGER", "DELAY_LINE_CAP", "GATHER_WAIT", "Connection", "Peer", "show_peer"]

log = logging.getLogger("episub.net")

# After our EOF, how long we keep reading for the peer's. Its last frames and its own EOF
# take one RTT; a peer that never closes must not hold the socket for long.
CLOSE_LINGER = 2.0  # guess: far above any RTT we serve, short enough not to pile sockets up
# Frames held back by link-delay emulation; when full, the writer waits, the peer's queue
# grows and the usual overflow rule applies, as on a real link.
DELAY_LINE_CAP = 1024  # guess: 1024 frames of ~1 KiB is a fat pipe at 30 ms
# How long a woken writer waits for the process to go idle before it writes anyway: the
# delay a busy process adds to a message so that a burst goes out in big writes.
GATHER_WAIT = 0.002  # guess: a few loopback round trips; far below any protocol timer

FrameItems = list[tuple[str | None, Message]]


def show_peer(peer_id: bytes) -> str:
    """A peer id for logs: ours are ASCII; anything else is shown escaped."""
    return peer_id.decode("ascii", "backslashreplace")


class Peer:
    """What the runtime keeps for one remote peer id."""

    def __init__(self, peer_id: bytes) -> None:
        self.id = peer_id
        self.queue: deque[bytes] = deque()  # encoded items (wire.encode_item)
        self.queued_bytes = 0
        self.conn: Connection | None = None  # where writes go; None while dialling
        self.conns: list[Connection] = []  # every open connection, a losing duplicate too
        self.dial_scope: trio.CancelScope | None = None  # set while a dial is in flight
        self.close_requested = False  # close once the queue is drained (ClosePeer)
        self.changed = trio.Event()
        self.gathering: trio.CancelScope | None = None  # the writer's wait for more items

    def notify(self) -> None:
        """Wake the writers: the queue, the current connection or the close request moved."""
        self.changed.set()
        self.changed = trio.Event()

    def hurry(self) -> None:
        """Enough is queued for a write: stop gathering."""
        if self.gathering is not None:
            self.gathering.cancel()

    def __repr__(self) -> str:
        return f"<Peer {show_peer(self.id)} queued={len(self.queue)} conns={len(self.conns)}>"


class Connection:
    def __init__(
        self,
        *,
        stream: trio.abc.HalfCloseableStream,
        peer: Peer,
        outbound: bool,
        session_key: bytes,
        trailing_data: bytes,
        sealed: bool = True,
        max_frame_size: int,
        delay: Callable[[], float] | None,
        on_frames: Callable[[Connection, list[FrameItems]], None],
        on_written: Callable[[Connection, int, int], None],
    ) -> None:
        if sealed:  # every byte after the handshake goes through sealed records
            send_key, receive_key = direction_keys(session_key, initiator=outbound)
            stream = SealedStream(
                stream, send_key=send_key, receive_key=receive_key, received=trailing_data
            )
            trailing_data = b""
        self.stream = stream
        self.peer = peer
        self.outbound = outbound
        self._reader = FrameReader(stream, max_frame_size=max_frame_size)
        self._trailing = trailing_data
        self._delay = delay  # link-delay emulation: seconds to hold each frame back
        self._max_delay = 0.0  # the longest hold so far: how long our EOF may be held too
        self._on_frames = on_frames
        self._on_written = on_written
        self._scope = trio.CancelScope()
        self._reader_done = trio.Event()
        now = trio.current_time()
        self.opened_at = now
        self.last_received = now
        self.last_sent = now
        self._last_write = -math.inf  # when the writer last wrote (gathering's clock)
        self.in_flight = 0  # items taken off the queue and not yet written
        self._bytes_in_reported = 0
        self.failure: str | None = None
        self.invalid_frame = False  # the peer sent bytes that are not a valid frame
        self.we_closed = False

    def take_bytes_in(self) -> int:
        """Bytes received since the last call (for the runtime's counters)."""
        total = self._reader.bytes_received
        delta, self._bytes_in_reported = total - self._bytes_in_reported, total
        return delta

    def abort(self, reason: str) -> None:
        """End the connection now (from any task, synchronously); `reason` is the failure."""
        if self.failure is None:
            self.failure = reason
        self._scope.cancel()

    async def serve(self) -> None:
        """Run reader and writer until the connection ends; then close the stream."""
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._read_loop)
                    if self._delay is not None:
                        send, receive = trio.open_memory_channel[tuple[float, bytes | None, int]](
                            DELAY_LINE_CAP
                        )
                        nursery.start_soon(self._delay_loop, receive)
                        nursery.start_soon(self._write_loop, send)
                    else:
                        nursery.start_soon(self._write_loop, None)
        finally:
            self.in_flight = 0
            await trio.aclose_forcefully(self.stream)

    # -- reading ------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            if self._trailing:
                self._reader.feed(self._trailing)
                self._trailing = b""
            while True:
                frames = await self._reader.receive_frames()
                if not frames:
                    break
                self.last_received = trio.current_time()
                self._on_frames(self, frames)
        except FrameError as exc:
            self.invalid_frame = True
            self.failure = self.failure or f"invalid frame: {exc}"
            log.warning("closing connection to %s: invalid frame: %s", show_peer(self.peer.id), exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.failure = self.failure or f"connection broken: {exc!r}"
        finally:
            self._reader_done.set()
        # The peer is done with this connection (EOF) or it is broken: end it all.
        self._scope.cancel()

    # -- writing ------------------------------------------------------------------------

    async def _write_loop(
        self, delay_line: trio.MemorySendChannel[tuple[float, bytes | None, int]] | None
    ) -> None:
        peer = self.peer
        try:
            while True:
                changed = peer.changed
                if peer.conn is not self:
                    break  # replaced by a better duplicate, or told to stop
                if not peer.queue:
                    if peer.close_requested:
                        break
                    await changed.wait()
                    continue
                if (
                    peer.queued_bytes < PIGGYBACK_BUDGET
                    and trio.current_time() - self._last_write < GATHER_WAIT
                ):
                    # Wrote a moment ago: a burst. Let the rest of it join this write.
                    with trio.move_on_after(GATHER_WAIT) as peer.gathering:
                        await wait_all_tasks_blocked()
                    peer.gathering = None
                    if peer.conn is not self or not peer.queue:
                        continue
                frame, count, frames = take_frames(peer.queue)
                peer.queued_bytes -= len(frame) - frames * LENGTH_PREFIX_SIZE
                self.in_flight += count
                if delay_line is not None:
                    await delay_line.send((self._due(), frame, count))
                else:
                    await self.stream.send_all(frame)
                    self._written(count, len(frame))
            # Stop writing: no new items go to this connection from here on.
            self.we_closed = True
            if peer.conn is self:
                peer.conn = None
                peer.close_requested = False
                peer.notify()
            if delay_line is not None:
                await delay_line.send((self._due(), None, 0))
            else:
                await self.stream.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.failure = self.failure or f"connection broken: {exc!r}"
            self._scope.cancel()
            return
        with trio.move_on_after(CLOSE_LINGER + self._max_delay):  # our EOF may be held back
            await self._reader_done.wait()
        self._scope.cancel()

    def _due(self) -> float:
        assert self._delay is not None
        delay = self._delay()
        self._max_delay = max(self._max_delay, delay)
        return trio.current_time() + delay

    def _written(self, count: int, size: int) -> None:
        self.in_flight -= count
        self.last_sent = self._last_write = trio.current_time()
        self._on_written(self, count, size)

    async def _delay_loop(
        self, delay_line: trio.MemoryReceiveChannel[tuple[float, bytes | None, int]]
    ) -> None:
        """Write frames when their time comes, in the order they were queued: a frame due
        before the one ahead of it waits for it, as on a real link (no reordering)."""
        try:
            async for due, frame, count in delay_line:
                await trio.sleep_until(due)
                if frame is None:
                    await self.stream.send_eof()
                    await trio.sleep(math.inf)  # the writer's linger ends the connection
                await self.stream.send_all(frame)
                self._written(count, len(frame))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.failure = self.failure or f"connection broken: {exc!r}"
            self._scope.cancel()
