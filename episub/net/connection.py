"""One peer's send queue, and one authenticated connection's reader and writer tasks.

A `Peer` outlives its connections: its queue fills while a dial is in flight and is
drained by whichever connection is the peer's current one (`Peer.conn`). A `Connection`
is one TCP stream after its handshake; it runs a reader (frames in, to the runtime) and a
writer (queue out, in piggybacked frames), and with link-delay emulation a third task
that holds frames back before writing them, in order.

Batching and wakeups, so that a message costs a few microseconds rather than a system call
and a task switch (a wakeup costs a process tens of microseconds on a busy VM):
- The reader reads the socket itself (non-blocking `os.read`, parked only in
  `trio.lowlevel.wait_readable`: one wakeup per burst that arrives) and hands every whole
  frame of one read to the runtime at once. The runtime feeds them to the core as one
  input and then writes what the core says to each peer right away (`flush`), from the
  same task: one sealed non-blocking `os.write` per peer, with no other task woken.
- Only when a write would block does the connection's writer task take over: it waits for
  the socket to be writable and writes what is left.
- What the application publishes in a burst is gathered (Nagle's rule): a publish less
  than `GATHER_WAIT` after the application's previous one to that peer, and after the
  last write to it, is left to the writer, which writes everything queued by then in one
  go at `GATHER_WAIT` after that write (or at once when `PIGGYBACK_BUDGET` bytes are
  queued). A publish after a quiet spell of the application's goes out at once, however
  busy the link is with messages relayed for others.

How a connection ends, and what the runtime makes of it (`Connection.failure`,
`Connection.we_closed`):
- we stop writing (ClosePeer, a duplicate that lost, idle, shutdown): the writer drains
  what it must, sends EOF, and waits up to `CLOSE_LINGER` for the peer's EOF, reading and
  processing what the peer sent meanwhile. Nothing is reported to the core.
- the peer sends EOF between frames: the connection ends; the runtime decides whether that
  was a goodbye or a loss.
- anything else (a bad frame, a reset, EOF inside a frame, an abort): `failure` says what.

All tasks of a connection live in one cancel scope (`abort()` cancels it) inside the
task that serves the connection; the stream is closed when they are all done. With
link-delay emulation the writer writes every frame through a delay line (a task of its own
that holds frames back, in order) instead of inline.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import struct
import sys
from collections import deque
from collections.abc import Callable

import trio

from episub.net.framing import PIGGYBACK_BUDGET, READ_CHUNK, take_frames
from episub.net.sealing import RecordOpener, RecordSealer, direction_keys
from episub.proto.messages import PeerMessage
from episub.proto.wire import LENGTH_PREFIX_SIZE, FrameDecoder, FrameError

__all__ = [
    "CLOSE_LINGER",
    "DELAY_LINE_CAP",
    "GATHER_WAIT",
    "KEEPALIVE_COUNT",
    "KEEPALIVE_IDLE",
    "KEEPALIVE_INTERVAL",
    "RTO_MAX",
    "TCP_INFO",
    "USER_TIMEOUT",
    "Connection",
    "Peer",
    "keep_alive",
    "show_peer",
]

log = logging.getLogger("episub.net")

# After our EOF, how long we keep reading for the peer's. Its last frames and its own EOF
# take one RTT; a peer that never closes must not hold the socket for long.
CLOSE_LINGER = 2.0  # guess: far above any RTT we serve, short enough not to pile sockets up
# Frames held back by link-delay emulation; when full, the writer waits, the peer's queue
# grows and the usual overflow rule applies, as on a real link.
DELAY_LINE_CAP = 1024  # guess: 1024 frames of ~1 KiB is a fat pipe at 30 ms
# How long after a write to a peer what the application publishes next is held back, so
# that a burst goes out in big writes (Nagle's rule): the delay a burst adds to a message.
GATHER_WAIT = 0.002  # guess: a few loopback round trips; far below any protocol timer
# Reads handled back to back before the reader lets other tasks run: a peer that keeps
# the socket full must not starve the rest of the node.
READS_PER_TURN = 16  # guess
# Items decoded from what one read buffered before the reader hands them over and lets
# other tasks run; the rest stays buffered for its next step. A 64 KiB read of small
# requests is ~6,500 items and ~130 ms of protobuf decoding on one core; a step decodes
# whole frames only, so at most this plus one frame's MAX_ITEMS_PER_FRAME.
DECODE_STEP_ITEMS = 512  # guess: a few ms of the costliest items; a burst's read is ~250

# The kernel watches every connection between the app's pings: after KEEPALIVE_IDLE
# seconds without traffic it probes the peer's host every KEEPALIVE_INTERVAL seconds and
# resets the connection after KEEPALIVE_COUNT unanswered probes, and data unacknowledged
# for USER_TIMEOUT resets it too. A dead or vanished host is found in ~40 s (what three
# missed pings took when pings were the only check) without waking the process; a process
# that dies is seen at once (its kernel sends FIN or RST). Guesses, from that target.
KEEPALIVE_IDLE = 20
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 4
USER_TIMEOUT = KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_COUNT  # seconds
# While a link is down, TCP retransmits what it sent with a wait that doubles each time (up
# to 2 min): after a 20 s outage the next try may come 10-25 s after the link's return, and
# the connection stalls until then. Capped here, it resumes within RTO_MAX of the return;
# a dead path costs a segment per RTO_MAX until USER_TIMEOUT. Linux 6.15+'s TCP_RTO_MAX_MS
# (not in Python's socket module yet; older kernels refuse it and keep the doubling).
# Guess: far above a LAN's RTT, well inside the configuration's catch-up after a cut.
RTO_MAX = 2.0  # seconds
TCP_RTO_MAX_MS = 44  # linux/tcp.h
# struct tcp_info (linux/tcp.h): tcpi_rtt, microseconds, is the u32 at byte 68 of the
# 104 bytes every kernel since 2.6 fills in. None of it where the platform has no TCP_INFO.
TCP_INFO: int | None = getattr(socket, "TCP_INFO", None) if sys.platform == "linux" else None
_TCP_INFO_SIZE = 104
_TCPI_RTT_OFFSET = 68
_U32 = struct.Struct("I")

FrameItems = list[tuple[str | None, PeerMessage]]


def keep_alive(sock: trio.socket.SocketType) -> None:
    """Let the kernel find a dead peer host (KEEPALIVE_IDLE above), and use a link that
    came back within RTO_MAX. Where the platform lacks an option (TCP_KEEPIDLE,
    TCP_USER_TIMEOUT are Linux's), the app's pings are left to find it."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (
            ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
            ("TCP_KEEPCNT", KEEPALIVE_COUNT),
            ("TCP_USER_TIMEOUT", USER_TIMEOUT * 1000),  # milliseconds
        ):
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
    except OSError as exc:  # a socket closed under us: its reader finds out
        log.debug("keepalive not set: %s", exc)
        return
    if sys.platform == "linux":
        # A kernel before 6.15 refuses it: retransmissions keep doubling there.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS, int(RTO_MAX * 1000))


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

    def notify(self) -> None:
        """Wake the writers: the current connection, the close request or (for a writer
        that writes everything itself: a new or a delayed connection) the queue moved."""
        self.changed.set()
        self.changed = trio.Event()

    def __repr__(self) -> str:
        return f"<Peer {show_peer(self.id)} queued={len(self.queue)} conns={len(self.conns)}>"


class Connection:
    def __init__(
        self,
        *,
        stream: trio.SocketStream,
        peer: Peer,
        outbound: bool,
        session_key: bytes,
        trailing_data: bytes,
        sealed: bool = True,
        max_frame_size: int,
        delay: Callable[[], float] | None,
        on_frames: Callable[[Connection, list[FrameItems], bool], FrameItems | None],
        on_written: Callable[[Connection, int, int], None],
    ) -> None:
        self.stream = stream
        self._socket = stream.socket
        self._fd = stream.socket.fileno()
        keep_alive(stream.socket)
        self._sealer: RecordSealer | None = None
        self._opener: RecordOpener | None = None
        if sealed:  # every byte after the handshake goes through sealed records
            send_key, receive_key = direction_keys(session_key, initiator=outbound)
            self._sealer = RecordSealer(send_key)
            self._opener = RecordOpener(receive_key)
        self.peer = peer
        self.outbound = outbound
        self._decoder = FrameDecoder(max_frame_size=max_frame_size)
        self._trailing = trailing_data
        self._delay = delay  # link-delay emulation: seconds to hold each frame back
        self._max_delay = 0.0  # the longest hold so far: how long our EOF may be held too
        self._on_frames = on_frames
        self._on_written = on_written
        # Items of a read the runtime left for a later step (a step's share of requests was
        # taken): handed over after a checkpoint, before anything more is read.
        self._backlog: FrameItems | None = None
        # Whole frames may wait in the decoder (a step decoded DECODE_STEP_ITEMS): decoded
        # after a checkpoint, before anything more is read.
        self._undecoded = False
        self._scope = trio.CancelScope()
        self._reader_done = trio.Event()
        now = trio.current_time()
        self.opened_at = now
        self.last_received = now
        self.last_sent = now
        self.rtt_due = now  # when the runtime next reads the kernel's RTT (kernel_rtt)
        self._last_write = -math.inf  # when we last wrote (gathering's clock)
        self._last_gather = -math.inf  # the application's last input flushed here
        self._flush_at: float | None = None  # the writer writes the queue then (gathering)
        # A write the socket took only in part: the rest, for the writer to finish once
        # the socket is writable, with the item count and plaintext size it carries.
        self._unwritten: memoryview | None = None
        self._unwritten_items = 0
        self._unwritten_size = 0
        self.in_flight = 0  # items taken off the queue and not yet written
        self._bytes_in = 0
        self._bytes_in_reported = 0
        self.failure: str | None = None
        self.invalid_frame = False  # the peer sent bytes that are not a valid frame
        self.we_closed = False

    def kernel_rtt(self) -> float | None:
        """The kernel's smoothed RTT of this connection in seconds (Linux's TCP_INFO
        tcpi_rtt), None where there is none (no TCP_INFO, no sample yet)."""
        if TCP_INFO is None:
            return None
        try:
            info = self._socket.getsockopt(socket.IPPROTO_TCP, TCP_INFO, _TCP_INFO_SIZE)
        except OSError:
            return None
        if len(info) < _TCPI_RTT_OFFSET + 4:
            return None
        (rtt_us,) = _U32.unpack_from(info, _TCPI_RTT_OFFSET)
        return rtt_us / 1e6 if rtt_us else None

    def take_bytes_in(self) -> int:
        """Bytes received since the last call (for the runtime's counters)."""
        delta, self._bytes_in_reported = self._bytes_in - self._bytes_in_reported, self._bytes_in
        return delta

    @property
    def aborted(self) -> bool:
        """Ending (abort(), a failed read or write): nothing more is written to it."""
        return self._scope.cancel_called

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
                self._received(self._trailing)
                self._trailing = b""
                await self._hand_over_backlog()
            fd, turn = self._fd, 0
            while True:
                try:
                    data = os.read(fd, READ_CHUNK)
                except BlockingIOError:
                    turn = 0
                    await trio.lowlevel.wait_readable(self._socket)
                    continue
                if not data:
                    self._check_clean_end()
                    break
                self._received(data)
                if self._backlog is not None or self._undecoded:
                    turn = 0
                    await self._hand_over_backlog()
                if len(data) < READ_CHUNK:
                    # A short read took what the socket held: wait for more rather than
                    # read again for an EAGAIN (an exception and a system call per frame).
                    turn = 0
                    await trio.lowlevel.wait_readable(self._socket)
                    continue
                turn += 1
                if turn >= READS_PER_TURN:
                    turn = 0
                    await trio.lowlevel.checkpoint()
        except FrameError as exc:
            self.invalid_frame = True
            self.failure = self.failure or f"invalid frame: {exc}"
            log.warning("closing connection to %s: invalid frame: %s", show_peer(self.peer.id), exc)
        except OSError as exc:
            self.failure = self.failure or f"connection broken: {exc!r}"
        finally:
            self._reader_done.set()
        # The peer is done with this connection (EOF) or it is broken: end it all.
        self._scope.cancel()

    def _check_clean_end(self) -> None:
        """The peer closed: between frames, or FrameError."""
        if self._opener is not None and self._opener.buffered:
            raise FrameError(
                f"connection closed inside a sealed record ({self._opener.buffered} bytes)"
            )
        if self._decoder.buffered:
            raise FrameError(
                f"connection closed inside a frame ({self._decoder.buffered} bytes of it received)"
            )

    def _received(self, data: bytes) -> None:
        """Bytes off the socket: the frames they complete go to the runtime, a step's
        share of them now (`_decode_step`). Frames before a bad one are handed over first;
        then FrameError."""
        self._bytes_in += len(data)
        if self._opener is not None:
            data = self._opener.feed(data)
            if not data:
                return
        decoder = self._decoder
        items = decoder.whole_frame(data)
        if items is not None:  # the usual read: one whole frame, nothing buffered
            self._hand_over([items])
            return
        decoder.feed(data)
        self._decode_step()

    def _decode_step(self) -> None:
        """Hand over the whole frames buffered, DECODE_STEP_ITEMS items of them at most (and
        the frame that passes it); `_undecoded` says whether it stopped there. Frames
        before a bad one are handed over first; then FrameError."""
        decoder = self._decoder
        frames: list[FrameItems] = []
        count = 0
        try:
            while count < DECODE_STEP_ITEMS and (frame := decoder.next_frame()) is not None:
                frames.append(frame)
                count += len(frame)
        except FrameError:
            self._undecoded = False
            if frames:
                self._hand_over(frames)
            raise
        self._undecoded = count >= DECODE_STEP_ITEMS
        if frames:
            self._hand_over(frames)

    async def _hand_over_backlog(self) -> None:
        """What the runtime left of the last read, then the frames still undecoded, a step
        at a time, other tasks between."""
        while self._backlog is not None or self._undecoded:
            await trio.lowlevel.checkpoint()
            if self._backlog is not None:
                backlog, self._backlog = self._backlog, None
                self.last_received = trio.current_time()
                self._backlog = self._on_frames(self, [backlog], True)
            else:
                self._decode_step()

    def _hand_over(self, frames: list[FrameItems]) -> None:
        self.last_received = trio.current_time()
        self._backlog = self._on_frames(self, frames, False)

    # -- writing ------------------------------------------------------------------------

    def flush(self, *, gather: bool = False) -> None:
        """Write what is queued for the peer now, from the calling task; only a write that
        would block is left to the writer. `gather`: the application's burst (see the
        module docstring), left to the writer while the last write is recent."""
        peer = self.peer
        if not peer.queue or self._unwritten is not None:
            return  # nothing to write, or the writer waits for the socket
        if self._delay is not None:
            peer.notify()  # the writer feeds the delay line
            return
        if gather:
            # A burst is the application's inputs coming back to back: what we relay in
            # between (other publishers' messages) is no reason to hold a publish back.
            now = trio.current_time()
            in_burst = now - self._last_gather < GATHER_WAIT
            self._last_gather = now
            if (
                in_burst
                and peer.queued_bytes < PIGGYBACK_BUDGET
                and now - self._last_write < GATHER_WAIT
            ):
                if self._flush_at is None:
                    self._flush_at = self._last_write + GATHER_WAIT
                    peer.notify()
                return
        self._flush_at = None
        self._write_queued()

    def _write_queued(self) -> None:
        """Write the queue until it is empty or the socket is full."""
        peer = self.peer
        fd = self._fd
        while peer.queue and not self.aborted:
            frame, count, frames = take_frames(peer.queue)
            peer.queued_bytes -= len(frame) - frames * LENGTH_PREFIX_SIZE
            data = frame if self._sealer is None else self._sealer.seal(frame)
            try:
                written = os.write(fd, data)
            except BlockingIOError:
                written = 0
            except OSError as exc:
                self.abort(f"connection broken: {exc!r}")
                return
            if written < len(data):
                self._unwritten = memoryview(data)[written:]
                self._unwritten_items = count
                self._unwritten_size = len(frame)
                self.in_flight += count
                peer.notify()  # the writer finishes it once the socket is writable
                return
            self._written(count, len(frame))

    async def _write_loop(
        self, delay_line: trio.MemorySendChannel[tuple[float, bytes | None, int]] | None
    ) -> None:
        peer = self.peer
        try:
            while True:
                changed = peer.changed
                if self._unwritten is not None:
                    await self._finish_write()
                    continue
                if peer.conn is not self:
                    break  # replaced by a better duplicate, or told to stop
                if not peer.queue:
                    if peer.close_requested:
                        break
                    await changed.wait()
                    continue
                if delay_line is not None:
                    frame, count, frames = take_frames(peer.queue)
                    peer.queued_bytes -= len(frame) - frames * LENGTH_PREFIX_SIZE
                    self.in_flight += count
                    await delay_line.send((self._due(), frame, count))
                    continue
                if self._flush_at is not None:
                    with trio.move_on_at(self._flush_at):
                        await changed.wait()
                    self._flush_at = None
                    continue
                self._write_queued()
                if self.aborted:  # the write failed: Cancelled here, the rest left unsealed
                    await trio.lowlevel.checkpoint()
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

    async def _finish_write(self) -> None:
        """Write the rest of a write the socket took only in part, as it drains."""
        while (rest := self._unwritten) is not None:
            await trio.lowlevel.wait_writable(self._socket)
            try:
                written = os.write(self._fd, rest)
            except BlockingIOError:
                continue
            if written < len(rest):
                self._unwritten = rest[written:]
                continue
            self._unwritten = None
            self.in_flight -= self._unwritten_items
            self._written(self._unwritten_items, self._unwritten_size)

    def _due(self) -> float:
        assert self._delay is not None
        delay = self._delay()
        self._max_delay = max(self._max_delay, delay)
        return trio.current_time() + delay

    def _written(self, count: int, size: int) -> None:
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
                    continue
                data = frame if self._sealer is None else self._sealer.seal(frame)
                await self.stream.send_all(data)
                self.in_flight -= count
                self._written(count, len(frame))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.failure = self.failure or f"connection broken: {exc!r}"
            self._scope.cancel()
