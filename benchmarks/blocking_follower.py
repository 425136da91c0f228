"""A prototype: a configuration node (a reader, or the writer) with episub's core, no trio.

What the readers and the writer of `config_broadcast.py` would cost if the runtime were
not trio's scheduler but one thread over epoll and plain socket calls (the design named
next for followers; benchmarks/wakeup_floor.py measures the two wakeups). Everything
a reader does to a message is the product's own code: the handshake and sealed records
(episub.net), frame decoding and the sans-IO core (episub.proto: membership, broadcast,
ordering, every check at entry), the configuration codec and state (episub.config). Only
the pump is new, and it is a prototype: sends are blocking `sendall`s, dials block for
the TCP connect (on loopback, immediate), and there is no flow control, admission, link
sweeping, retention, catch-up or snapshot sync. It is not part of the package and must
not become one as it stands; it answers "how much of a reader's CPU is the runtime's?".

    from blocking_follower import BlockingFollower
    follower = BlockingFollower(key, topic, contact)
    while ...:
        follower.step(timeout)        # one epoll wait: reads, timers, sends
        follower.state.version        # the configuration's version

or, the node in a thread of its own and the application waiting on a lock (what a
product would do, so that the node serves its peers whatever the application does):

    threading.Thread(target=follower.serve, daemon=True).start()
    follower.wait_for(version, timeout)
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import secrets
import select
import socket
import threading
import time
from collections.abc import Hashable
from random import Random

from episub.config.codec import ConfigCodecError, Update, decode
from episub.config.replica import write_message
from episub.config.state import ConfigState
from episub.net.framing import max_frame_size
from episub.net.handshake import NONCE_SIZE, Handshake, HandshakeError
from episub.net.peer_id import make_peer_id, parse_peer_id
from episub.net.runtime import with_runtime_upkeep
from episub.net.sealing import RecordOpener, RecordSealer, direction_keys
from episub.proto.config import NodeConfig
from episub.proto.events import (
    ClosePeer,
    ConnectionLost,
    Deliver,
    JoinTopic,
    NeighborDown,
    NeighborUp,
    OutEvent,
    Publish,
    ScheduleTimer,
    Send,
    TimerFired,
)
from episub.proto.framing import FrameError
from episub.proto.node import NodeState
from episub.proto.wire import FrameDecoder, encode_item, frame_from_items

READ_CHUNK = 64 * 1024


class _Conn:
    """One TCP connection: handshaking, then sealed frames both ways."""

    def __init__(self, sock: socket.socket, machine: Handshake, initiator: bool) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.machine: Handshake | None = machine
        self.initiator = initiator
        self.peer: bytes | None = None
        self.sealer: RecordSealer | None = None
        self.opener: RecordOpener | None = None
        self.decoder: FrameDecoder | None = None
        self.pending: list[bytes] = []  # items queued while the handshake runs


class BlockingFollower:
    """A node of one topic, driven by `step()` from the caller's thread."""

    def __init__(
        self, key: bytes, topic: str, contact: str | None, host: str = "127.0.0.1"
    ) -> None:
        """Join `topic` through the node listening at `contact` ("host:port"); None: be
        the topic's first node, which the others join through (a writer)."""
        self._key = key
        self.topic = topic
        self._listener = socket.create_server((host, 0))
        self._listener.setblocking(False)
        self.me = make_peer_id(host, self._listener.getsockname()[1])
        config = with_runtime_upkeep(NodeConfig(), kernel_rtt=False)
        self.core = NodeState(self.me, config, Random())
        self._max_frame = max_frame_size(config.broadcast.max_message_size)
        self.state = ConfigState()
        self._epoll = select.epoll()
        self._epoll.register(self._listener.fileno(), select.EPOLLIN)
        self._by_fd: dict[int, _Conn] = {}
        self._conns: dict[bytes, _Conn] = {}  # peer id -> the connection we send on
        self._timers: list[tuple[float, int, Hashable]] = []
        self._timer_seq = itertools.count()
        self._epoch = time.time() - time.monotonic()
        self._unflushed: dict[_Conn, list[bytes]] = {}
        self.neighbors = 0
        self.malformed = 0
        self._moved = threading.Condition()  # the version rose (wait_for)
        self._waiting = 0  # wait_for callers
        self._stopped = False
        bootstrap = () if contact is None else (self._connect(contact),)
        self._carry_out(self.core.handle(JoinTopic(topic, bootstrap), self._now()))
        self._flush()

    @property
    def address(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"{host}:{port}"

    def write(self, values: dict[str, object]) -> int:
        """Publish one configuration write, as ConfigReplica.write does (a stream of its
        own, the codec's update); returns its version. Its sends go out at once."""
        version, writer = self.state.stamp_for_write(self.me)
        entries, payload, stream = write_message(values, version, writer)
        publish = Publish(self.topic, payload, stream=stream)
        self._carry_out(self.core.handle(publish, self._now()))
        self._flush()
        self.state.apply_update(version, entries)
        return version

    def _now(self) -> float:
        return time.monotonic() + self._epoch

    # -- the pump -------------------------------------------------------------------------

    def step(self, timeout: float) -> None:
        """Wait up to `timeout` s (less if a timer is due) for input; handle all of it."""
        if self._timers:
            timeout = max(0.0, min(timeout, self._timers[0][0] - time.monotonic()))
        by_fd = self._by_fd
        for fd, _ in self._epoll.poll(timeout):
            conn = by_fd.get(fd)
            if conn is None:
                self._accept()
            else:
                self._readable(conn)
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            token = heapq.heappop(self._timers)[2]
            self._carry_out(self.core.handle(TimerFired(token), self._now()))
        self._flush()

    def _readable(self, conn: _Conn) -> None:
        try:
            data = os.read(conn.fd, READ_CHUNK)
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        if conn.machine is not None:
            self._handshaking(conn, data)
        else:
            self._received(conn, data)

    def _received(self, conn: _Conn, data: bytes) -> None:
        """Sealed bytes of an authenticated connection: every frame they complete goes
        into the core as one input."""
        assert conn.opener is not None and conn.decoder is not None and conn.peer is not None
        try:
            plain = conn.opener.feed(data)
            if not plain:
                return
            items = conn.decoder.whole_frame(plain)
            if items is None:
                conn.decoder.feed(plain)
                items = []
                while (frame := conn.decoder.next_frame()) is not None:
                    items.extend(frame)
        except FrameError:
            self._close(conn)
            return
        if items:
            out: list[OutEvent] = []
            self.core.handle_received(conn.peer, items, self._now(), out)
            self._carry_out(out)

    def _carry_out(self, outputs: list[OutEvent]) -> None:
        encoded: dict[int, bytes] = {}
        for out in outputs:
            kind = type(out)
            if kind is Send:
                item = encoded.get(id(out.message))  # type: ignore[union-attr]
                if item is None:
                    item = encoded[id(out.message)] = encode_item(out.topic, out.message)  # type: ignore[union-attr]
                self._queue(out.peer, item)  # type: ignore[union-attr]
            elif kind is Deliver:
                self._apply(out.envelope.payload)  # type: ignore[union-attr]
            elif kind is ScheduleTimer:
                deadline = time.monotonic() + out.delay  # type: ignore[union-attr]
                heapq.heappush(self._timers, (deadline, next(self._timer_seq), out.token))  # type: ignore[union-attr]
            elif kind is NeighborUp:
                self.neighbors += 1
            elif kind is NeighborDown:
                self.neighbors -= 1
            elif kind is ClosePeer:
                conn = self._conns.get(out.peer)  # type: ignore[union-attr]
                if conn is not None:
                    self._flush()
                    self._close(conn)

    def _apply(self, payload: bytes) -> None:
        try:
            message = decode(payload)
        except ConfigCodecError:
            self.malformed += 1
            return
        if type(message) is not Update:
            return
        changed = self.state.apply_update(message.version, message.changes)
        if changed and self._waiting:  # after the version rose: see wait_for
            with self._moved:
                self._moved.notify_all()

    # -- the node in a thread of its own -----------------------------------------------------

    def serve(self) -> None:
        """Pump until `stop()`: the node's own thread."""
        while not self._stopped:
            self.step(0.5)

    def stop(self) -> None:
        self._stopped = True

    def wait_for(self, version: int, timeout: float) -> bool:
        """From another thread than serve()'s: wait until the version is at least
        `version`; False after `timeout` s."""
        with self._moved:
            self._waiting += 1
            try:
                return self._moved.wait_for(lambda: self.state.version >= version, timeout)
            finally:
                self._waiting -= 1

    # -- connections ----------------------------------------------------------------------

    def _queue(self, peer: bytes, item: bytes) -> None:
        conn = self._conns.get(peer)
        if conn is None:
            conn = self._dial(peer)
            if conn is None:
                return
        if conn.sealer is None:
            conn.pending.append(item)
        else:
            self._unflushed.setdefault(conn, []).append(item)

    def _flush(self) -> None:
        unflushed, self._unflushed = self._unflushed, {}
        for conn, items in unflushed.items():
            self._write(conn, items)

    def _write(self, conn: _Conn, items: list[bytes]) -> None:
        assert conn.sealer is not None
        try:
            conn.sock.sendall(conn.sealer.seal(frame_from_items(items)))
        except OSError:
            self._close(conn)

    def _dial(self, peer: bytes) -> _Conn | None:
        try:
            address = parse_peer_id(peer)
            sock = socket.create_connection((address.host, address.port), timeout=2.0)
        except (OSError, ValueError):
            self._lost(peer)
            return None
        conn = self._start(sock, initiator=True)
        self._conns[peer] = conn  # sends wait in `pending` for the handshake
        conn.peer = peer
        return conn

    def _connect(self, address: str, timeout: float = 10.0) -> bytes:
        """Dial a bootstrap address and wait for its handshake: the peer id it proves."""
        host, port = address.rsplit(":", 1)
        conn = self._start(socket.create_connection((host, int(port)), timeout=timeout),
                           initiator=True)  # fmt: skip
        conn.sock.settimeout(timeout)
        while conn.machine is not None:
            data = conn.sock.recv(READ_CHUNK)
            if not data:
                raise ConnectionError(f"{address} closed the connection during the handshake")
            self._handshaking(conn, data)
            if conn.sock.fileno() < 0:
                raise ConnectionError(f"the handshake with {address} failed")
        conn.sock.settimeout(None)
        assert conn.peer is not None
        return conn.peer

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        self._start(sock, initiator=False)

    def _start(self, sock: socket.socket, *, initiator: bool) -> _Conn:
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        machine = Handshake(key=self._key, my_id=self.me, initiator=initiator,
                            nonce=secrets.token_bytes(NONCE_SIZE))  # fmt: skip
        conn = _Conn(sock, machine, initiator)
        sock.sendall(machine.data_to_send())
        self._epoll.register(conn.fd, select.EPOLLIN)
        self._by_fd[conn.fd] = conn
        return conn

    def _handshaking(self, conn: _Conn, data: bytes) -> None:
        machine = conn.machine
        assert machine is not None
        try:
            machine.receive_data(data)
            if outgoing := machine.data_to_send():
                conn.sock.sendall(outgoing)
        except (HandshakeError, OSError):
            self._close(conn)
            return
        if not machine.done:
            return
        result = machine.result
        conn.machine = None
        if conn.peer is not None and conn.peer != result.peer_id:
            self._close(conn)
            return
        conn.peer = result.peer_id
        send_key, receive_key = direction_keys(result.session_key, initiator=conn.initiator)
        conn.sealer, conn.opener = RecordSealer(send_key), RecordOpener(receive_key)
        conn.decoder = FrameDecoder(max_frame_size=self._max_frame)
        self._conns.setdefault(conn.peer, conn)  # an inbound one carries our sends too
        if conn.pending:
            self._write(conn, conn.pending)
            conn.pending = []
        if result.trailing_data:
            self._received(conn, result.trailing_data)

    def _close(self, conn: _Conn) -> None:
        if self._by_fd.pop(conn.fd, None) is conn:
            with contextlib.suppress(OSError):
                self._epoll.unregister(conn.fd)
        conn.sock.close()
        self._unflushed.pop(conn, None)
        if conn.peer is not None and self._conns.get(conn.peer) is conn:
            del self._conns[conn.peer]
            self._lost(conn.peer)

    def _lost(self, peer: bytes) -> None:
        self._carry_out(self.core.handle(ConnectionLost(peer), self._now()))

    def close(self) -> None:
        """Close every socket (after `stop()` and the end of `serve()`'s thread)."""
        for conn in list(self._by_fd.values()):
            conn.sock.close()
        self._listener.close()
        self._epoll.close()
