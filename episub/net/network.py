"""Peers and their connections: queues, dialling, inbound handshakes, duplicates, closes.

`Network` knows nothing of the protocol. The runtime hands it encoded items to send,
asks it to close peers, and learns through three callbacks what it must tell the core:
frames that arrived (`on_frames`), peers that became unreachable (`on_lost`), and it
answers one question for it (`uses`: is this peer still a neighbour in some topic?).

Rules:
- Sending: the item joins the peer's queue; with no connection a dial starts (one per
  peer at a time, bounded by `dial_timeout`, then `handshake_timeout`). A queue over
  `send_queue_cap` items or `send_queue_max_bytes` means the peer cannot keep up: it is
  lost (connections closed, queue dropped, `on_lost`). Memory stays bounded.
- A failed dial is a loss. So is a dialled address answering with another peer id (the
  node restarted): the old id is lost, the connection is kept under the new one.
- An id at our own address but not ours is a former incarnation of this node (restarted
  on its port): peers gossip it until it ages out. It is lost at once, never dialled: the
  dial would reach our own listener and fail the handshake at both ends.
- Two connections to one peer (both sides dialled at once) are resolved the same way at
  both ends: the one dialled by the lower id stays; the other is closed gracefully after
  what was already written on it has been read (connection.py).
- A connection that ends is a loss when it failed (bad frame, reset, abort) or when the
  peer closed it while the core still uses the peer; a peer that leaves a link it no
  longer needs says DISCONNECT or LEAVE first, on the same connection, so its EOF is a
  goodbye. Closes we start (ClosePeer, idle, duplicates, shutdown) are never losses.
- A publisher waits for room (`wait_for_room`): while a peer's queue is over half its
  cap, a publish waits for it to drain, so that a burst paces itself to its slowest live
  neighbour instead of overflowing its queue and losing the link. A peer that stays over
  half full for the whole wait is too slow, and is lost as on overflow.
- Answers (what a peer asked for: `answer`) wait in the peer's lane (answers.py) as
  recipes and are encoded while its queue is under an eighth of its bounds, within the
  peer's byte budget; the lane goes with the peer's connection. They are encoded and
  written by a task of their own (`_answer_loop`), ANSWER_STEP_BYTES a step, peer after
  peer: never in the step that read the request or wrote the last answer, so that a
  read of honest frames waits at most one such step behind what a peer asked. When
  a lane empties, the core is told (`on_answers_drained`): it makes the next batch of
  what the peer asked; when the connection goes, the core drops it
  (`on_answers_cancelled`). An empty lane is kept, with its byte budget, until the
  budget is full again (`sweep`), so that batch after batch is paced by one budget. A
  peer's requests are charged to its work budget (`charge`): refused past it, and the peer
  dropped when it asks on regardless. Answers never overflow a queue: a peer that does
  not read what it asked for only fills its lane.
- Overflow warnings are logged at most once a minute per kind, with a count (log_limit.py).
- Inbound connections hold a slot until their handshake ends; an outsider cannot take them
  all (admission.py), and the failures it causes are logged at most once a minute per
  reason (log_limit.py), counted in full.
- Connections the core does not use that carried nothing for `idle_timeout` are closed;
  a neighbour silent for `liveness_timeout` is lost, since TCP alone may take many
  minutes to notice a vanished host.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, fields
from functools import partial

import trio

from episub.net.admission import MAX_PENDING_HANDSHAKES, HandshakeSlots, source_of
from episub.net.answers import AnswerCounters, AnswerLane, RequestBudget, Verdict
from episub.net.connection import Connection, FrameItems, Peer, show_peer
from episub.net.handshake import (
    FAILURE_REASONS,
    HandshakeError,
    HandshakeResult,
    perform_handshake,
)
from episub.net.link_delay import LinkDelay
from episub.net.log_limit import LogLimiter
from episub.net.peer_id import Address, PeerIdError, parse_peer_id
from episub.proto.signing import Signer

__all__ = [
    "DIAL_TIMEOUT",
    "IDLE_TIMEOUT",
    "MAX_CONNECTIONS",
    "MAX_PENDING_HANDSHAKES",
    "SEND_QUEUE_CAP",
    "SEND_QUEUE_MAX_BYTES",
    "NetCounters",
    "Network",
]

log = logging.getLogger("episub.net")

# Answer bytes encoded (and then written) in one step of the answer task before other tasks
# run: at least one answer, however large. ~0.6 ms of CPU at benchmarks/answer_cost.py's
# 2.2-2.6 ms per MB. Guess: a few steps per TCP send window, well under honest delivery's
# few milliseconds; a catch-up at the byte budget (answers.ANSWER_BYTES_PER_SECOND) takes
# ~130 such steps a second.
ANSWER_STEP_BYTES = 256 * 1024

# A peer's send queue: a few seconds of a busy topic's traffic to one neighbour. A peer
# further behind than this is too slow, and waiting for it would hold memory for nothing.
SEND_QUEUE_CAP = 4096  # guess: messages
SEND_QUEUE_MAX_BYTES = 16 * 1024 * 1024  # guess; raised to 2 frames if max frames are larger
DIAL_TIMEOUT = 10.0  # Kafka's socket.connection.setup.timeout.ms default (10 s)
# Authenticated connections held at once. A peer holding the key can claim any id, so it
# could otherwise open connections without end. Guess: a node's links are its views in
# each topic (7 active + probes of a 42-entry passive view) and a few bootstrap contacts.
MAX_CONNECTIONS = 512
# A passive peer is probed about once per passive_size * passive_probe_interval (42 * 2 s,
# +-25% jitter: 63-105 s). At 60 s nearly every probe dialled anew (the config benchmark
# at 32 nodes: 266 dials in 20 s); 120 s keeps the connection for the next probe, at the
# price of up to one idle connection per passive peer (two parked tasks, no CPU).
IDLE_TIMEOUT = 120.0  # from the probe cycle above


@dataclass(slots=True)
class NetCounters:
    """Runtime counters, as `node.stats()` reports them."""

    connections_opened: int = 0
    connections_closed: int = 0
    dials: int = 0
    dial_failures: int = 0
    handshake_failures: int = 0  # dialled and accepted connections, each end counts its own
    connections_refused: int = 0  # authenticated, but past max_connections
    frames_in: int = 0
    frames_out: int = 0
    messages_in: int = 0
    messages_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    invalid_frames: int = 0
    queue_overflows: int = 0
    publish_waits: int = 0  # publishes that waited for a peer's queue to drain
    peer_misbehaved: int = 0
    peers_lost: int = 0
    core_errors: int = 0
    # Outgoing messages dropped, by why; every reason is always present.
    dropped: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("queue_overflow", "peer_lost", "unencodable", "oversized", "shutdown", "to_self"), 0
        )
    )

    # handshake_failures by why (handshake.FAILURE_REASONS); every reason always present.
    handshake_failed: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0)
    )
    answers: AnswerCounters = field(default_factory=AnswerCounters)

    def as_dict(self) -> dict[str, int]:
        out = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("dropped", "handshake_failed", "answers")
        }
        out.update({f.name: getattr(self.answers, f.name) for f in fields(self.answers)})
        out.update({f"dropped_{reason}": n for reason, n in self.dropped.items()})
        out.update({f"handshake_failed_{why}": n for why, n in self.handshake_failed.items()})
        return out

    def count_handshake_failure(self, exc: HandshakeError) -> None:
        self.handshake_failures += 1
        self.handshake_failed[exc.reason] += 1


class Network:
    def __init__(
        self,
        *,
        key: bytes,
        me: bytes,
        counters: NetCounters,
        on_frames: Callable[[Connection, list[FrameItems], bool], FrameItems | None],
        on_lost: Callable[[bytes], None],
        on_answers_drained: Callable[[bytes], None],
        on_answers_cancelled: Callable[[bytes], None],
        uses: Callable[[bytes], bool],
        max_frame_size: int,
        liveness_timeout: float,
        link_delay: LinkDelay | None,
        handshake_timeout: float,
        dial_timeout: float,
        send_queue_cap: int,
        send_queue_max_bytes: int,
        idle_timeout: float,
        encrypt: bool = True,
        max_connections: int = MAX_CONNECTIONS,
        signer: Signer | None = None,
    ) -> None:
        self._key = key
        self._signer = signer
        self._max_connections = max_connections
        self._encrypt = encrypt
        self.me = me
        self._address = _address_of(me)
        self.counters = counters
        self._on_frames = on_frames
        self._on_lost = on_lost
        self._on_answers_drained = on_answers_drained
        self._on_answers_cancelled = on_answers_cancelled
        self._uses = uses
        self._max_frame_size = max_frame_size
        self._liveness_timeout = liveness_timeout
        self._link_delay = link_delay
        self._handshake_timeout = handshake_timeout
        self._dial_timeout = dial_timeout
        self._queue_cap = send_queue_cap
        self._queue_max_bytes = max(send_queue_max_bytes, 2 * max_frame_size)
        # A peer is crowded over half its queue bounds (wait_uncrowded). Its queued items
        # (in flight included) and bytes grow only in send(), so a send that leaves its peer
        # over half marks the network suspect, and only a suspect network is looked over
        # peer by peer: a publish costs O(1), not O(peers), while nobody is crowded.
        self._half_items = send_queue_cap // 2
        self._half_bytes = self._queue_max_bytes // 2
        self._crowd_suspect = False
        self._idle_timeout = idle_timeout
        self.peers: dict[bytes, Peer] = {}
        self._unflushed: dict[bytes, Peer] = {}  # peers sent to since the last flush()
        # Set whenever bytes go out or a connection ends; made when someone waits for it
        # (`_progress_event`): most writes have no one waiting, and an Event each costs.
        self._progress: trio.Event | None = None
        self._nursery: trio.Nursery | None = None
        self._listener_scope = trio.CancelScope()
        self._handshakes = HandshakeSlots(timeout=handshake_timeout)
        self._strangers_log = LogLimiter(log)  # what inbound connections can cause, many times over
        self._drops_log = LogLimiter(log)  # overflows: a peer can cause them, many times over
        # A lane is refilled while its peer's queue is under these (an eighth of its bounds):
        # far from the half at which publishers wait for the peer (wait_for_room).
        self._fill_items = max(1, send_queue_cap // 8)
        self._fill_bytes = self._queue_max_bytes // 8
        # Peers with answers waiting, or whose byte budget is still refilling.
        self._lanes: dict[bytes, AnswerLane] = {}
        # Peers whose lanes the answer task serves next (`_answer_loop`), in turn.
        self._answers_due: dict[bytes, Peer] = {}
        self._answers_wakeup = trio.Event()
        self._budgets: dict[bytes, RequestBudget] = {}  # peers that asked something
        self.closing = False

    async def run(
        self,
        listeners: list[trio.SocketListener],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve `listeners`; own the tasks of dials and connections. Runs until cancelled.
        The owner calls `sweep()` every `sweep_interval` seconds."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._listen, listeners)
            nursery.start_soon(self._answer_loop)
            task_status.started()
            await trio.sleep_forever()

    @property
    def sweep_interval(self) -> float:
        """How often `sweep()` must run: idle and silent connections are found within a
        quarter of their timeouts."""
        return min(self._idle_timeout, self._liveness_timeout) / 4

    async def _listen(
        self,
        listeners: list[trio.SocketListener],
        *,
        task_status: trio.TaskStatus[list[trio.SocketListener]],
    ) -> None:
        # Handlers run in our nursery, not the listener's: when the listener stops at
        # shutdown, the connections it accepted still close gracefully.
        with self._listener_scope:
            await trio.serve_listeners(
                self._on_inbound, listeners, handler_nursery=self._nursery, task_status=task_status
            )

    # -- sending --------------------------------------------------------------------------

    def send(self, peer_id: bytes, item: bytes) -> None:
        """Queue an encoded item (wire.encode_item) for `peer_id`; dial if need be. It goes
        out at the next `flush()`."""
        if self.closing:
            self.counters.dropped["shutdown"] += 1
            return
        peer = self.peers.get(peer_id)
        if peer is None:
            peer = self.peers[peer_id] = Peer(peer_id)
        queue = peer.queue
        queued = len(queue)
        queued_bytes = peer.queued_bytes + len(item)
        if queued >= self._queue_cap or queued_bytes > self._queue_max_bytes:
            self._overflow(peer)
            return
        queue.append(item)
        peer.queued_bytes = queued_bytes
        if not self._crowd_suspect and self._over_half(peer):  # once suspect, no need
            self._crowd_suspect = True
        peer.close_requested = False
        self._unflushed[peer_id] = peer
        if peer.conn is None and peer.dial_scope is None:
            self._start_dial(peer)

    def flush(self, *, gather: bool = False) -> None:
        """Write what `send` queued since the last flush to the peers' sockets now, from
        the calling task (connection.py: one wakeup per burst received, no task switch);
        `gather`: for the application's publishes (Nagle's rule, connection.GATHER_WAIT).
        A peer still being dialled gets its queue when its connection comes up."""
        unflushed = self._unflushed
        if not unflushed:
            return
        self._unflushed = {}
        for peer in unflushed.values():
            conn = peer.conn
            if conn is not None:
                conn.flush(gather=gather)

    def close_peer(self, peer_id: bytes) -> None:
        """Close the peer's connection once its queue is drained (the core's ClosePeer)."""
        peer = self.peers.get(peer_id)
        if peer is None:
            return
        if peer.conn is None and peer.dial_scope is None and not peer.queue:
            if not peer.conns:
                del self.peers[peer.id]
            return
        peer.close_requested = True
        peer.notify()

    async def wait_for_room(self, max_wait: float) -> None:
        """Return once no peer's send queue is over half its cap (items or bytes): a
        publisher's flow control. A peer still over half after `max_wait` is lost, as a
        full queue is (so one stuck peer cannot stall a publisher for long)."""
        crowded = self._crowded()
        if not crowded:
            return
        self.counters.publish_waits += 1
        with trio.move_on_after(max_wait):
            while crowded:
                await self._progress_event().wait()
                crowded = self._crowded()
            return
        for peer in crowded:
            self._overflow(peer, f"over half full for {max_wait:g} s while a publish waited")

    async def flushed(self, peer_id: bytes) -> None:
        """Return once nothing is queued or being written for `peer_id` (at once when it
        is not connected); bound it from outside."""
        while True:
            progress = self._progress_event()
            peer = self.peers.get(peer_id)
            conn = None if peer is None else peer.conn
            if conn is None or (not peer.queue and conn.in_flight == 0):  # type: ignore[union-attr]
                await trio.lowlevel.checkpoint()
                return
            await progress.wait()

    def _crowded(self) -> list[Peer]:
        if not self._crowd_suspect:
            return []
        crowded = [p for p in self.peers.values() if self._over_half(p)]
        if not crowded:
            self._crowd_suspect = False  # until a send leaves a peer over half again
        return crowded

    def _over_half(self, peer: Peer) -> bool:
        """Is `peer` over half its queue bounds? Items taken into a write that has not
        completed count: they still wait on the peer."""
        conn = peer.conn
        return (
            peer.queued_bytes > self._half_bytes
            or len(peer.queue) + (0 if conn is None else conn.in_flight) > self._half_items
        )

    def _overflow(self, peer: Peer, how: str = "overflowed") -> None:
        self.counters.queue_overflows += 1
        self.counters.dropped["queue_overflow"] += len(peer.queue)
        self._drops_log.log(
            how,
            trio.current_time(),
            logging.WARNING,
            "send queue to %s %s (%d messages, %d bytes queued): the peer is too slow; "
            "closing its connection",
            show_peer(peer.id),
            how,
            len(peer.queue),
            peer.queued_bytes,
        )
        peer.queue.clear()
        peer.queued_bytes = 0
        self._lose(peer, "send queue overflow")

    def _lose(self, peer: Peer, reason: str) -> None:
        """The peer is unreachable: drop what is queued, close its connections, report it.
        Its connections, ending later, find the peer forgotten and stay quiet."""
        if self.peers.get(peer.id) is peer:
            del self.peers[peer.id]
        self._forget_requests(peer.id)
        self.counters.peers_lost += 1
        self.counters.dropped["peer_lost"] += len(peer.queue)
        peer.queue.clear()
        peer.queued_bytes = 0
        peer.conn = None
        for conn in peer.conns:
            conn.abort(reason)
        if peer.dial_scope is not None:
            peer.dial_scope.cancel()
        peer.notify()
        self._notify_progress()
        if not self.closing:
            self._on_lost(peer.id)

    # -- dialling -------------------------------------------------------------------------

    def _start_dial(self, peer: Peer) -> None:
        assert self._nursery is not None, "the network is not running"
        if self._address is not None and _address_of(peer.id) == self._address:
            log.info("%s is a former incarnation of this node; not dialled", show_peer(peer.id))
            self._lose(peer, "a former incarnation of this node")
            return
        peer.dial_scope = trio.CancelScope()
        self._nursery.start_soon(self._dial, peer, peer.dial_scope)

    async def _open(self, address: Address) -> tuple[trio.SocketStream, HandshakeResult]:
        """Dial and authenticate `address`; OSError or HandshakeError on failure."""
        self.counters.dials += 1
        stream: trio.SocketStream | None = None
        try:
            with trio.move_on_after(self._dial_timeout):
                stream = await trio.open_tcp_stream(address.host, address.port)
            if stream is None:
                raise TimeoutError(f"no connection to {address} within {self._dial_timeout} s")
        except OSError:
            self.counters.dial_failures += 1
            raise
        try:
            result = await self._handshake(stream, initiator=True, timeout=self._handshake_timeout)
        except BaseException as exc:
            if isinstance(exc, HandshakeError):
                self.counters.count_handshake_failure(exc)
            await trio.aclose_forcefully(stream)
            raise
        return stream, result

    async def _handshake(
        self, stream: trio.SocketStream, *, initiator: bool, timeout: float
    ) -> HandshakeResult:
        return await perform_handshake(
            stream,
            key=self._key,
            my_id=self.me,
            initiator=initiator,
            timeout=timeout,
            encrypt=self._encrypt,
            signer=self._signer,
        )

    async def _dial(self, peer: Peer, scope: trio.CancelScope) -> None:
        opened: tuple[trio.SocketStream, HandshakeResult] | None = None
        failure = ""
        with scope:
            try:
                opened = await self._open(parse_peer_id(peer.id))
            except HandshakeError as exc:
                failure = f"handshake failed ({exc.reason}): {exc}"
            except (OSError, PeerIdError) as exc:
                failure = str(exc) or repr(exc)
        if peer.dial_scope is scope:
            peer.dial_scope = None
        self._notify_progress()
        if opened is None:
            if not scope.cancelled_caught and self.peers.get(peer.id) is peer:
                log.info("dial to %s failed: %s", show_peer(peer.id), failure)
                self._lose(peer, f"dial failed: {failure}")
            return
        stream, result = opened
        if scope.cancel_called or self.closing:  # lost or shut down meanwhile
            await trio.aclose_forcefully(stream)
            return
        if result.peer_id != peer.id:
            log.info(
                "%s answered as %s (restarted?); the old id is gone",
                show_peer(peer.id),
                show_peer(result.peer_id),
            )
            if self.peers.get(peer.id) is peer:
                self._lose(peer, "answered with another peer id")
        await self._serve(self._register(stream, result, outbound=True))

    async def connect(self, address: Address) -> bytes:
        """Connect to `address` (a bootstrap contact); return the peer id it proves.

        Reuses a live connection to a peer at that address. OSError or HandshakeError.
        """
        for peer in list(self.peers.values()):
            if peer.conn is not None and _address_of(peer.id) == address:
                return peer.id
        stream, result = await self._open(address)
        if self.closing:
            await trio.aclose_forcefully(stream)
            raise trio.ClosedResourceError("the node is shutting down")
        conn = self._register(stream, result, outbound=True)
        assert self._nursery is not None
        self._nursery.start_soon(self._serve, conn)
        return result.peer_id

    async def _on_inbound(self, stream: trio.SocketStream) -> None:
        """The listener's handler: authenticate, then serve until the connection ends."""
        host, where = _remote(stream)
        if self.closing:
            return  # serve_listeners closes the stream
        pending = self._handshakes.open(source_of(host), trio.current_time())
        result: HandshakeResult | None = None
        try:
            with pending.scope:
                # The slot's scope holds the deadline (shorter under pressure), so the
                # handshake's own timeout never fires first.
                result = await self._handshake(stream, initiator=False, timeout=math.inf)
        except HandshakeError as exc:
            self._inbound_failed(where, exc)
            return
        finally:
            self._handshakes.close(pending)
        if result is None:  # the slot's scope was cancelled
            if pending.evicted:
                why = "its slot went to a newer connection (all taken; its source held the most)"
                self._inbound_failed(where, HandshakeError(why, reason="evicted"))
            else:
                limit = pending.scope.deadline - pending.started  # shorter under pressure
                why = f"no complete handshake within {limit:g} s"
                self._inbound_failed(where, HandshakeError(why, reason="timeout"))
            return
        if self.closing:
            return
        held = sum(len(peer.conns) for peer in self.peers.values())
        if held >= self._max_connections:
            self.counters.connections_refused += 1
            self._strangers_log.log(
                "max_connections",
                trio.current_time(),
                logging.WARNING,
                "refusing %s from %s: %d connections held already (max_connections)",
                show_peer(result.peer_id),
                where,
                held,
            )
            return
        await self._serve(self._register(stream, result, outbound=False))

    def _inbound_failed(self, where: str, exc: HandshakeError) -> None:
        self.counters.count_handshake_failure(exc)
        self._strangers_log.log(
            exc.reason,
            trio.current_time(),
            logging.WARNING,
            "handshake with %s (it dialled) failed (%s): %s",
            where,
            exc.reason,
            exc,
        )

    # -- connections ----------------------------------------------------------------------

    def _register(
        self, stream: trio.SocketStream, result: HandshakeResult, *, outbound: bool
    ) -> Connection:
        peer_id = result.peer_id
        peer = self.peers.get(peer_id)
        if peer is None:
            peer = self.peers[peer_id] = Peer(peer_id)
        link_delay = self._link_delay
        conn = Connection(
            stream=stream,
            peer=peer,
            outbound=outbound,
            session_key=result.session_key,
            trailing_data=result.trailing_data,
            sealed=self._encrypt,
            max_frame_size=self._max_frame_size,
            delay=None if link_delay is None else partial(link_delay, self.me, peer_id),
            on_frames=self._on_frames,
            on_written=self._on_written,
        )
        peer.conns.append(conn)
        if peer.conn is None or self._prefer(conn, peer.conn):
            peer.conn = conn  # a replaced connection's writer sees this and closes it
        peer.notify()
        self.counters.connections_opened += 1
        log.debug("connected to %s (%s)", show_peer(peer_id), "out" if outbound else "in")
        return conn

    def _prefer(self, new: Connection, old: Connection) -> bool:
        """Both ends keep the connection dialled by the lower id; of two dialled by the same
        side, the newer (the older is likely dead at the other end)."""
        peer_id = new.peer.id
        new_dialer = self.me if new.outbound else peer_id
        old_dialer = self.me if old.outbound else peer_id
        return new_dialer == old_dialer or new_dialer == min(self.me, peer_id)

    async def _serve(self, conn: Connection) -> None:
        try:
            await conn.serve()
        finally:
            self._ended(conn)

    def _ended(self, conn: Connection) -> None:
        peer = conn.peer
        self.counters.connections_closed += 1
        self.counters.invalid_frames += conn.invalid_frame
        if conn in peer.conns:
            peer.conns.remove(conn)
        if peer.conn is conn:
            peer.conn = None
        if peer.conn is None:
            self._forget_requests(peer.id)  # the asker's connection went: so do its answers
        self._notify_progress()
        if self.closing or self.peers.get(peer.id) is not peer:
            return  # shutting down, or the peer was already lost and reported
        if peer.conn is not None or peer.dial_scope is not None:
            return  # another connection carries on
        if not conn.we_closed and (conn.failure is not None or self._uses(peer.id)):
            reason = conn.failure or "closed by the peer while still a neighbour"
            log.info("lost %s: %s", show_peer(peer.id), reason)
            self._lose(peer, reason)
        elif peer.queue:
            self._start_dial(peer)  # queued while the connection was closing
        elif not peer.conns:
            del self.peers[peer.id]

    def _on_written(self, conn: Connection, count: int, size: int) -> None:
        counters = self.counters
        counters.frames_out += 1
        counters.messages_out += count
        counters.bytes_out += size
        if self._lanes:
            lane = self._lanes.get(conn.peer.id)
            if lane is not None and lane.items:
                self._answer_soon(conn.peer)  # room in its queue again: its next answers
        self._notify_progress()

    # -- answers and request budgets ---------------------------------------------------------

    def answer(
        self, peer_id: bytes, key: Hashable, size: int, make: Callable[[], bytes | None]
    ) -> None:
        """Queue an answer for `peer_id`: `make()` encodes it (None: it cannot be) when the
        peer's queue has room and its byte budget allows; `key` merges repeats, `size`
        (about its encoded size) counts against the lane's bounds."""
        peer = self.peers.get(peer_id)
        if peer is None or peer.conn is None or self.closing:
            self.counters.answers.answers_cancelled += 1  # it asked and went
            return
        lane = self._lanes.get(peer_id)
        if lane is None:
            lane = self._lanes[peer_id] = AnswerLane(trio.current_time())
        lane.add(key, size, make, self.counters.answers)
        self._answer_soon(peer)

    def charge(self, peer_id: bytes, work: float) -> Verdict:
        """Charge `work` for a request of `peer_id` (answers.RequestBudget): OK, THROTTLED
        (refuse it) or OVER: the peer is dropped here, refuse it too."""
        now = trio.current_time()
        budget = self._budgets.get(peer_id)
        if budget is None:
            budget = self._budgets[peer_id] = RequestBudget(now)
        verdict = budget.charge(work, now)
        if verdict is Verdict.THROTTLED:
            self.counters.answers.requests_throttled += 1
        elif verdict is Verdict.OVER:
            self.counters.answers.requests_throttled += 1
            self.counters.answers.peers_over_budget += 1
            peer = self.peers.get(peer_id)
            self._drops_log.log(
                "over_budget",
                now,
                logging.WARNING,
                "dropping %s: its requests cost more than their budget (%g work/s)",
                show_peer(peer_id),
                budget.bucket.rate,
            )
            if peer is not None:
                self._lose(peer, "over its request budget")
            else:
                self._forget_requests(peer_id)
        return verdict

    def _answer_soon(self, peer: Peer) -> None:
        """The answer task serves `peer`'s lane at its next step (`_answer_loop`)."""
        self._answers_due[peer.id] = peer
        self._answers_wakeup.set()

    async def _answer_loop(self) -> None:
        """Encode and write the waiting answers of the peers due, ANSWER_STEP_BYTES of one
        peer's a step, each peer in turn, letting every other task run between steps."""
        due = self._answers_due
        while True:
            while due:
                peer = due.pop(next(iter(due)))
                if self.peers.get(peer.id) is peer and self._refill(peer, ANSWER_STEP_BYTES):
                    due[peer.id] = peer  # more waits and there is room: after the others
                self.flush()
                await trio.lowlevel.checkpoint()
            self._answers_wakeup = trio.Event()
            await self._answers_wakeup.wait()

    def _refill(self, peer: Peer, step_bytes: int) -> bool:
        """Encode the peer's waiting answers into its queue while it is under the fill
        marks and its byte budget lasts, about `step_bytes` of them (at least one); past
        the budget, a wakeup when it refills. True when it stopped at `step_bytes` only."""
        lane = self._lanes.get(peer.id)
        if lane is None:
            return False
        conn = peer.conn
        counters = self.counters.answers
        now = trio.current_time()
        if conn is None or conn.aborted or not lane.items:
            return False  # an aborted connection's end cancels the lane (_ended)
        peer.notify()  # a writer parked on an empty queue (a delay line's) takes them
        made = 0
        while lane.items:
            if (
                peer.queued_bytes >= self._fill_bytes
                or len(peer.queue) + conn.in_flight >= self._fill_items
            ):
                return False  # the writer's next write makes it due again (_on_written)
            if made >= step_bytes:
                return True
            wait = lane.bucket.wait(now)
            if wait > 0:
                counters.answers_throttled += 1
                if not lane.timer_set and self._nursery is not None:
                    lane.timer_set = True
                    self._nursery.start_soon(self._refill_later, peer, lane, wait)
                return False
            _, make = lane.take()
            item = make()
            if item is None:
                continue
            made += len(item)
            lane.bucket.level -= len(item)
            counters.answers_sent += 1
            self.send(peer.id, item)
        self._on_answers_drained(peer.id)  # the last one went: the core makes the next batch
        return False

    async def _refill_later(self, peer: Peer, lane: AnswerLane, wait: float) -> None:
        await trio.sleep(wait)
        lane.timer_set = False
        if self._lanes.get(peer.id) is lane and self.peers.get(peer.id) is peer:
            self._answer_soon(peer)

    def _forget_requests(self, peer_id: bytes) -> None:
        """The peer's waiting answers go; its budget stays until it is owed nothing
        (`sweep`), so that a new connection does not wipe a debt."""
        lane = self._lanes.pop(peer_id, None)
        if lane is not None:
            lane.cancel(self.counters.answers)
        self._on_answers_cancelled(peer_id)

    def _notify_progress(self) -> None:
        progress = self._progress
        if progress is not None:
            self._progress = None
            progress.set()

    def _progress_event(self) -> trio.Event:
        """The Event the next progress sets: take it before checking what it waits for."""
        if self._progress is None:
            self._progress = trio.Event()
        return self._progress

    def sweep(self) -> None:
        """Close idle connections nobody uses; declare silent neighbours lost; forget the
        budgets and empty lanes of peers that owe nothing."""
        now = trio.current_time()
        for peer_id, budget in list(self._budgets.items()):
            budget.bucket.refill(now)
            if budget.idle:
                del self._budgets[peer_id]
        for peer_id, lane in list(self._lanes.items()):
            if lane.idle(now):
                del self._lanes[peer_id]
        for peer in list(self.peers.values()):
            conn = peer.conn
            if conn is None:
                continue
            if self._uses(peer.id):
                silent = now - conn.last_received
                if silent > self._liveness_timeout:
                    log.info("neighbour %s silent for %.1f s", show_peer(peer.id), silent)
                    conn.abort(f"silent for {silent:.1f} s")
            elif (
                not peer.queue
                and conn.in_flight == 0
                and now - max(conn.last_received, conn.last_sent) > self._idle_timeout
            ):
                peer.close_requested = True
                peer.notify()

    # -- shutting down ---------------------------------------------------------------------

    async def close(self) -> None:
        """Stop listening, refuse new work, drain every queue, close every connection
        gracefully, and wait for them all to end (bound it from outside)."""
        self.closing = True
        self._listener_scope.cancel()
        for peer in self.peers.values():
            if peer.dial_scope is not None:
                peer.dial_scope.cancel()  # what it would carry is dropped anyway
            peer.close_requested = True
            peer.notify()
        while True:
            progress = self._progress_event()
            if not any(peer.conns or peer.dial_scope for peer in self.peers.values()):
                return
            await progress.wait()

    # -- queries ----------------------------------------------------------------------------

    def connected_peers(self) -> list[bytes]:
        return [peer.id for peer in self.peers.values() if peer.conn is not None]

    def stats(self) -> dict[str, int]:
        return {
            "connections": sum(len(peer.conns) for peer in self.peers.values()),
            "queued_messages": sum(len(peer.queue) for peer in self.peers.values()),
            "answers_waiting": sum(len(lane) for lane in self._lanes.values()),
            "answers_waiting_bytes": sum(lane.bytes for lane in self._lanes.values()),
        }


def _address_of(peer_id: bytes) -> Address | None:
    try:
        return parse_peer_id(peer_id)
    except PeerIdError:
        return None


def _remote(stream: trio.SocketStream) -> tuple[str, str]:
    """The peer's host, and "host:port" for logs."""
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "", "an unknown address"
    return host, f"{host}:{port}"
