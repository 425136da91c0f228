"""The trio runtime: one NodeState driven over TCP.

The runtime only pumps (aioquic's protocol.py): it feeds the core an input with `now`,
carries out the outputs, and re-arms the timer task. What each output becomes:

- Send: the message is encoded once (wire.encode_item; a GOSSIP to seven peers is one
  encoding) and handed to the network, which queues it for the peer (network.py); once
  all of an input's outputs are carried out, the network writes every peer's queue from
  the task that fed the input (network.flush): a received burst is read, processed and
  forwarded in one wakeup.
- ScheduleTimer: (deadline, seq, token) on a heap; one task sleeps until the earliest
  (in one cancel scope whose deadline moves: scheduling a timer never wakes the task).
  Its hints save wakeups: `coalesce` rounds the deadline up to a tick of the shared
  (epoch) clock, `upkeep` to a tick of the node's own, at a phase of its own (from its
  id); and timers due within `TIMER_SLACK` of each other fire in one wakeup.
  A Send marked `answer` (what the peer asked for) is not encoded here: the network
  takes it a batch at a time as the peer reads, within its budget (answers.py). When
  the peer's lane empties the core is fed AnswersDrained and makes its next batch of
  what the peer asked (proto/answers.py); when its connection goes, AnswersCancelled.
- ClosePeer: the network closes that connection once its queue is drained.
- PeerMisbehaved: counted, and logged (logger "episub.net") at most once a minute per
  reason.
- Deliver, Published, DataLost, NeighborUp, NeighborDown, Isolated: handed to `on_events`
  (the API), all of one input's together, in order.

A peer's requests (PULL, GRAFT over ranges, GETHELD, GETNODES, GETVIEW, GETTOPICS) are
charged to its work budget before the core sees them (`_admitted`): a request past it is
refused (a GRAFT keeps its link change and loses its ranges), and a peer that asks on
regardless is dropped.

Inputs come from the listener and connections (Received, ConnectionLost), the timer task
(TimerFired) and the API (JoinTopic, LeaveTopic, Publish, ...). The core is called from
one task at a time and never re-entered: an input that arises while outputs are carried
out (a queue overflow's ConnectionLost) is fed right after them.

Containment, the second line behind the core's own checks: an exception out of the core
(or out of carrying out its outputs) on any path never ends the node. It is counted
(`core_errors`) and logged with its traceback at most once a minute per kind; a peer
whose frame caused it is cut off; a timer it failed on fires again `TIMER_RETRY` later
(its re-arming was among the lost outputs); a command's caller gets `CoreError` (a
`LocalProtocolError`, the caller's misuse, reaches it as it is). The node carries on.

`now` for the core is trio's clock plus a fixed offset to the Unix epoch, taken once: it
is monotonic, as the core needs, and the timestamps the core stamps on messages read as
wall-clock milliseconds, as users of the timestamp expect.

Every task lives in the runtime's nursery, which the caller's cancellation does not reach:
the runtime ends with `shutdown()`, which leaves the topics and closes gracefully first.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import re
import time
import zlib
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import replace
from functools import partial
from random import Random
from typing import Any

import trio

from episub.net.answers import Verdict
from episub.net.connection import TCP_INFO, Connection, FrameItems, show_peer
from episub.net.framing import max_frame_size
from episub.net.handshake import HANDSHAKE_TIMEOUT, check_key
from episub.net.link_delay import LinkDelay
from episub.net.log_limit import LOG_INTERVAL, LogLimiter
from episub.net.network import (
    DIAL_TIMEOUT,
    IDLE_TIMEOUT,
    MAX_CONNECTIONS,
    SEND_QUEUE_CAP,
    SEND_QUEUE_MAX_BYTES,
    NetCounters,
    Network,
)
from episub.net.peer_id import Address
from episub.proto import messages as m
from episub.proto.config import NodeConfig
from episub.proto.errors import LocalProtocolError
from episub.proto.events import (
    AnswersCancelled,
    AnswersDrained,
    ClosePeer,
    ConnectionLost,
    InEvent,
    LeaveTopic,
    OutEvent,
    PeerMisbehaved,
    Received,
    RttMeasured,
    ScheduleTimer,
    Send,
    TimerFired,
)
from episub.proto.node import NodeState
from episub.proto.signing import Signer
from episub.proto.store import RetentionConfig
from episub.proto.wire import encode_item

__all__ = [
    "DIAL_TIMEOUT",
    "LIVENESS_PINGS",
    "SETTLED_UPKEEP",
    "SLOW_TICK",
    "TIMER_TICK",
    "CoreError",
    "Runtime",
    "with_runtime_upkeep",
]

log = logging.getLogger("episub.net")

# What a misbehaviour reason quotes of a peer's message: a repr (b'...', '...') or a number.
_QUOTED = re.compile(r"""b?'(?:[^'\\]|\\.)*'|b?"(?:[^"\\]|\\.)*"|\d+""")

# Missed pings (at the settled pace) before a silent neighbour is declared lost. The app's
# pings are there for what the kernel cannot see, a hung or stopped process whose kernel
# still answers for it: a dead host or process closes the connection by itself (TCP
# keepalive and user timeout, connection.py; a process's kernel sends FIN/RST). Both ends
# ping, so a live peer is never silent for a whole ping period. Guess.
LIVENESS_PINGS = 2
# MembershipConfig.settled_upkeep where the config leaves it to the runtime (None): a
# settled node pings every 60 s, probes every 12 s, stabilises every 12 s and optimises
# every 30 s (at the defaults). Guess: as far as hung-process detection allows (two
# missed pings, ~155 s); wakeups are what an idle node's CPU goes to.
SETTLED_UPKEEP = 6.0
# The kernel's RTT of a connection is read with the first frame of a read at most this
# often (a getsockopt, ~0.5 us) and fed to the core as an RTT sample (RttMeasured); PONGs
# then sample none (MembershipConfig.pong_rtt). Guess: the RTT table's smoothing wants a
# sample a second at most.
KERNEL_RTT_INTERVAL = 1.0
# Coalescible timers (ScheduleTimer.coalesce: pings, probes) are rounded up to a whole tick
# of the epoch clock, upkeep timers (ScheduleTimer.upkeep) to a tick of the node's own. A
# wakeup of an idle process costs 100-300 us of CPU here whatever it does (trio, cold
# caches, the VM), so upkeep costs what its wakeups cost. Guess: 2 s, a small part of the
# ping, probe, stabilisation and optimisation periods.
TIMER_TICK = 2.0
# Upkeep timers set at least SLOW_TICK_AFTER ahead (a settled node's: settled_upkeep)
# ride coarser ticks of the node's own phase, so that its stabilisation, probes, pings,
# optimisation, shuffles and the sweep, each every 12-60 s, share wakeups instead of
# taking one each: at most one timer wakeup per SLOW_TICK. Guess: a tenth of the settled
# ping period, half the settled stabilisation period.
SLOW_TICK = 6.0
SLOW_TICK_AFTER = 4 * TIMER_TICK
# Timers due this close together fire in one wakeup (Linux's timer slack does the same
# for sleeps): ones set for the same instant by arithmetic on different clocks
# differ by rounding. Guess: far below any protocol period, far above rounding.
TIMER_SLACK = 0.001
# The network's sweep (idle and silent connections) rides on the timer heap, on the
# node's upkeep ticks: a token of the runtime's own, never fed to the core.
_SWEEP = object()
TIMER_RETRY = 1.0  # seconds before a timer the core failed on fires again (guess)

# What a request costs a peer's work budget (answers.REQUEST_WORK_PER_SECOND), in store
# rows looked at and answered (a GETHELD span). A seq of a PULL or GRAFT is one dict
# lookup, a guessed 1/8 of that (its bytes are charged to the answer budget apart). A
# view, node or topic list is at most MAX_PEERS_PER_MESSAGE (256) entries from memory:
# 16, a guess.
_SEQS_PER_WORK = 8
_LIST_COST = 16
# An answer's size in a lane, before it is encoded: a GOSSIP is its envelope's bytes and
# ~50 of framing and id; a HELD at most MAX_HELD_SPANS spans of ~100 bytes.
_GOSSIP_OVERHEAD = 64
_ANSWER_SIZE: dict[type, int] = {m.Held: m.MAX_HELD_SPANS * 100}
_REQUEST_COSTS: dict[type, Callable[[Any], int]] = {
    m.Pull: lambda pull: (pull.last_seq - pull.first_seq) // _SEQS_PER_WORK + 1,
    m.Graft: lambda graft: sum(r[2] - r[1] + 1 for r in graft.ranges) // _SEQS_PER_WORK,
    m.GetHeld: lambda ask: len(ask.spans) or m.MAX_HELD_SPANS,
    m.GetNodes: lambda _: _LIST_COST,
    m.GetView: lambda _: _LIST_COST,
    m.GetTopics: lambda _: _LIST_COST,
}


class CoreError(RuntimeError):
    """The core failed on a command (a bug of ours, not the caller's misuse): counted as
    `core_errors` and logged; the node carries on. The core's exception is the cause."""


class Runtime:
    def __init__(
        self,
        *,
        key: bytes,
        my_id: bytes,
        config: NodeConfig,
        rng: Random,
        on_events: Callable[[list[OutEvent]], None],
        link_delay: LinkDelay | None = None,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        dial_timeout: float = DIAL_TIMEOUT,
        send_queue_cap: int = SEND_QUEUE_CAP,
        send_queue_max_bytes: int = SEND_QUEUE_MAX_BYTES,
        idle_timeout: float = IDLE_TIMEOUT,
        encrypt: bool = True,
        max_connections: int = MAX_CONNECTIONS,
        signer: Signer | None = None,
        retention: RetentionConfig | None = None,
    ) -> None:
        for name, value in (
            ("handshake_timeout", handshake_timeout),
            ("dial_timeout", dial_timeout),
            ("idle_timeout", idle_timeout),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, not {value!r}")
        if send_queue_cap < 1:
            raise ValueError(f"send_queue_cap must be >= 1, not {send_queue_cap!r}")
        self.me = my_id
        # RTT from the kernel where it sees the delays: not under emulated link delays.
        self._kernel_rtt = TCP_INFO is not None and link_delay is None
        config = with_runtime_upkeep(config, kernel_rtt=self._kernel_rtt)
        self.state = NodeState(my_id, config, rng, signer=signer, retention=retention)
        self._on_events = on_events
        self.max_frame_size = max_frame_size(config.broadcast.max_message_size)
        ping = config.membership
        # An active neighbour pings us and answers our pings at least every ping_interval
        # (stretched once settled, + jitter): two missed ones and the ping timeout mean it
        # is hung, though its kernel still keeps the connection.
        longest_ping = ping.ping_interval * max(ping.settled_upkeep or 1.0, 1.0)
        self.liveness_timeout = (
            LIVENESS_PINGS * (longest_ping * (1 + ping.timer_jitter) + SLOW_TICK)
            + ping.ping_timeout
        )
        self.counters = NetCounters()
        self.network = Network(
            key=check_key(key),
            me=my_id,
            counters=self.counters,
            on_frames=self._on_frames,
            on_lost=self._on_lost,
            on_answers_drained=self._on_answers_drained,
            on_answers_cancelled=self._on_answers_cancelled,
            uses=self.state.uses,
            max_frame_size=self.max_frame_size,
            liveness_timeout=self.liveness_timeout,
            link_delay=link_delay,
            handshake_timeout=handshake_timeout,
            dial_timeout=dial_timeout,
            send_queue_cap=send_queue_cap,
            send_queue_max_bytes=send_queue_max_bytes,
            idle_timeout=idle_timeout,
            encrypt=encrypt,
            max_connections=max_connections,
            signer=signer,
        )
        self._timers: list[tuple[float, int, Hashable]] = []  # (deadline, seq, token)
        self._timer_seq = itertools.count()
        # Timers that may fire early while the node is awake (ScheduleTimer.early):
        # heap entry -> when it may. A few at a time (one IHAVE flush per topic).
        self._early: dict[tuple[float, int, Hashable], float] = {}
        self._early_from = math.inf  # no early timer may fire before (a lower bound)
        self._sleep: trio.CancelScope | None = None  # the timer task's, until the head
        # The phase of this node's own upkeep ticks: spread over the tick by its id, so
        # that nodes' upkeep decisions do not line up.
        self._upkeep_phase = zlib.crc32(my_id) / 2**32 * TIMER_TICK
        self._answer_keys = itertools.count()  # answers that no repeat merges with
        self._deferred: deque[InEvent] = deque()
        self._drained: set[bytes] = set()  # peers with an AnswersDrained still to feed
        self._pumping = False
        self._run_scope = trio.CancelScope(shield=True)
        self._epoch = time.time() - trio.current_time()
        # Core errors and misbehaving peers: one line per kind a minute (LOG_INTERVAL).
        self._peer_log = LogLimiter(log, LOG_INTERVAL)

    # -- running --------------------------------------------------------------------------

    async def run(
        self,
        listeners: list[trio.SocketListener],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve `listeners` and drive the core until `shutdown()`.

        Shielded from the caller's cancellation: the owner ends the runtime with shutdown(),
        which still needs these tasks to send LEAVE when the owner is being cancelled.
        """
        with self._run_scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.network.run, listeners)
                nursery.start_soon(self._timer_loop)
                task_status.started()

    def now(self) -> float:
        """The core's clock: monotonic, in seconds since the Unix epoch (see the docstring)."""
        return trio.current_time() + self._epoch

    async def connect(self, address: Address) -> bytes:
        """Connect to a bootstrap address; the peer id it proves (network.connect)."""
        return await self.network.connect(address)

    async def shutdown(self, timeout: float) -> None:
        """Leave every topic, stop listening, drain the queues and close every connection
        gracefully, within `timeout` seconds even if the caller is being cancelled; then
        end every task."""
        try:
            with trio.move_on_after(timeout) as scope:
                scope.shield = True
                for topic in self.state.topics():
                    self._feed(LeaveTopic(topic))
                await self.network.close()
        finally:
            self.network.closing = True
            self._run_scope.cancel()

    # -- the pump -------------------------------------------------------------------------

    def input(self, event: InEvent) -> list[OutEvent]:
        """Feed the core a command (JoinTopic, Publish, ...) and carry out its outputs;
        returns them. What it sends goes out gathered with the application's burst, if any.
        The caller's misuse raises LocalProtocolError; a failure of the core itself is
        counted and raises CoreError. Either way the node carries on."""
        if self._pumping:
            self._deferred.append(event)
            return []
        try:
            outputs = self.state.handle(event, self.now())
        except LocalProtocolError:
            raise
        except Exception as exc:
            self._core_error(event, exc)
            raise CoreError(f"the core failed on {type(event).__name__}: {exc!r}") from exc
        self._pumping = True
        try:
            self._carry_out_contained(outputs, event)
            self._feed_deferred()
        finally:
            self._pumping = False
        self.network.flush(gather=True)
        return outputs

    def _feed(self, event: InEvent) -> bool:
        """Feed the core an input from a peer, a timer or the node itself, carry out its
        outputs, then write what they sent, from this task (network.flush); False if the
        core failed on it (counted and logged, never raised)."""
        if self._pumping:
            self._deferred.append(event)
            return True
        self._pumping = True
        try:
            ok = self._feed_one(event)
            self._feed_deferred()
        finally:
            self._pumping = False
        self.network.flush()
        return ok

    def _feed_one(self, event: InEvent) -> bool:
        if type(event) is AnswersDrained:
            self._drained.discard(event.peer)
        try:
            self._carry_out(self.state.handle(event, self.now()))
        except Exception as exc:
            self._core_error(event, exc)
            if type(event) is TimerFired:
                # What the failed call would have output is lost, its timer's re-arming
                # included: fire it again later, or a periodic timer (stabilisation,
                # pings) would stop for good after one failure.
                self._schedule(TIMER_RETRY, event.token)
            return False
        return True

    def _feed_deferred(self) -> None:
        while self._deferred:
            self._feed_one(self._deferred.popleft())

    def _carry_out_contained(self, outputs: list[OutEvent], cause: InEvent) -> None:
        try:
            self._carry_out(outputs)
        except Exception as exc:
            self._core_error(cause, exc)

    def _core_error(self, event: InEvent, exc: Exception) -> None:
        """Count and log (at most once a minute per kind) a failure of the core."""
        self.counters.core_errors += 1
        what = type(event).__name__
        if type(event) is Received:
            what += f" {type(event.message).__name__}"
        kind = (what, type(exc).__name__)
        self._peer_log.log(
            kind,
            trio.current_time(),
            logging.ERROR,
            "episub core error handling %s: %r; counted as core_errors, the node carries on",
            what,
            exc,
            exc_info=exc,
        )

    def _carry_out(self, outputs: list[OutEvent]) -> None:
        encoded: dict[tuple[str | None, int], bytes] = {}  # one encoding per message object
        events: list[OutEvent] = []
        for out in outputs:
            kind = type(out)
            if kind is Send:
                self._send(out, encoded)  # type: ignore[arg-type]
            elif kind is ScheduleTimer:
                self._schedule(out.delay, out.token, out.coalesce, out.upkeep, out.early)  # type: ignore[union-attr]
            elif kind is ClosePeer:
                self.network.close_peer(out.peer)
            elif kind is PeerMisbehaved:
                self.counters.peer_misbehaved += 1
                # One line a minute per kind of reason: the reason without what it quotes
                # of the peer's message (sizes, hop counts, ids, topics), which the peer
                # could vary at will.
                kind = _QUOTED.sub("_", out.reason)
                self._peer_log.log(
                    kind,
                    trio.current_time(),
                    logging.WARNING,
                    "peer %s misbehaved: %s",
                    _show(out.peer),
                    out.reason,
                )
            else:
                events.append(out)
        if events:
            self._on_events(events)

    def _send(self, out: Send, encoded: dict[tuple[str | None, int], bytes]) -> None:
        if out.peer == self.me:
            self.counters.dropped["to_self"] += 1
            log.error("the core sent %s to ourselves; dropped", type(out.message).__name__)
            return
        if out.answer:
            self._answer(out)
            return
        cache_key = (out.topic, id(out.message))
        item = encoded.get(cache_key)
        if item is None:
            item = self._encode(out.topic, out.message, out.peer)
            if item is None:
                return
            encoded[cache_key] = item
        self.network.send(out.peer, item)

    def _answer(self, out: Send) -> None:
        """An answer waits in the peer's lane as the message the core gave (the cache's or
        retention's bytes, not a copy) and is encoded when the network takes it."""
        message = out.message
        if type(message) is m.Gossip:
            key: Hashable = (out.topic, message.id)  # a repeat of a waiting answer merges
            size = len(message.raw) + _GOSSIP_OVERHEAD
        elif type(message) is m.History:
            # A repeated PULL packs the same messages (the cache's or retention's bytes
            # objects, whose hashes are kept): it merges with the pack still waiting.
            envelopes = message.envelopes
            key = (out.topic, message.publisher, envelopes[0], envelopes[-1], len(envelopes))
            size = sum(map(len, message.envelopes)) + _GOSSIP_OVERHEAD
        else:
            key = next(self._answer_keys)
            size = _ANSWER_SIZE.get(type(message), _GOSSIP_OVERHEAD)
        self.network.answer(
            out.peer, key, size, partial(self._encode, out.topic, message, out.peer)
        )

    def _encode(self, topic: str | None, message: m.PeerMessage, peer: bytes) -> bytes | None:
        """wire.encode_item, or None (counted and logged) when it cannot go."""
        dropped = self.counters.dropped
        try:
            item = encode_item(topic, message)
        except (TypeError, ValueError) as exc:
            dropped["unencodable"] += 1
            log.error("cannot encode %r for %s: %s", message, _show(peer), exc)
            return None
        if len(item) > self.max_frame_size:
            # The peer would refuse the frame and drop the connection; only this goes.
            dropped["oversized"] += 1
            log.error(
                "%s of %d bytes to %s exceeds the %d-byte frame limit; dropped",
                type(message).__name__,
                len(item),
                _show(peer),
                self.max_frame_size,
            )
            return None
        return item

    def _admitted(
        self, peer_id: bytes, items: list[tuple[str | None, m.PeerMessage]]
    ) -> list[tuple[str | None, m.PeerMessage]]:
        """`items` less the requests the peer's work budget refuses (a refused GRAFT keeps
        its link change: it comes in without ranges); none when the peer is dropped."""
        refused: list[int] = []
        for i, (_, message) in enumerate(items):
            cost = _REQUEST_COSTS.get(type(message))
            if cost is None:
                continue
            work = cost(message)
            if not work:
                continue
            verdict = self.network.charge(peer_id, work)
            if verdict is Verdict.OVER:
                return []
            if verdict is Verdict.THROTTLED:
                refused.append(i)
        if not refused:
            return items
        kept = list(items)
        for i in reversed(refused):
            topic, message = kept[i]
            if type(message) is m.Graft:
                kept[i] = (topic, m.Graft())
            else:
                del kept[i]
        return kept

    def _on_frames(self, conn: Connection, frames: list[FrameItems]) -> None:
        """Every frame of one read goes into the core as one input."""
        counters = self.counters
        counters.frames_in += len(frames)
        items = frames[0] if len(frames) == 1 else [item for frame in frames for item in frame]
        counters.messages_in += len(items)
        counters.bytes_in += conn.take_bytes_in()
        peer_id = conn.peer.id
        received = conn.last_received  # trio.current_time() as the read handed them over
        if self._kernel_rtt and conn.rtt_due <= received:
            # First, so that a PONG from a peer measured nowhere else finds it measured.
            conn.rtt_due = received + KERNEL_RTT_INTERVAL
            rtt = conn.kernel_rtt()
            if rtt is not None:
                if self._pumping:
                    self._deferred.append(RttMeasured(peer_id, rtt))
                else:
                    self._feed_one(RttMeasured(peer_id, rtt))
        items = self._admitted(peer_id, items)
        if not items:
            return
        if self._pumping:
            self._deferred.extend(Received(peer_id, topic, message) for topic, message in items)
            return
        self._pumping = True
        outputs: list[OutEvent] = []
        cause = Received(peer_id, items[0][0], items[0][1])  # what a failure is logged as
        try:
            try:
                # Outputs are appended as they arise: after a failure, what the items before
                # it (and the failing one, up to where it stopped) changed still goes out.
                self.state.handle_received(peer_id, items, received + self._epoch, outputs)
            except Exception as exc:
                # A core bug met by a peer's input: the peer is cut off, the node carries on.
                self._core_error(cause, exc)
                conn.abort("core error")
            self._carry_out_contained(outputs, cause)
            self._feed_deferred()
            if self._early_from <= received:
                self._fire_early()
        finally:
            self._pumping = False
        self.network.flush()

    def _fire_early(self) -> None:
        """Fire the timers that may fire early (ScheduleTimer.early) and may by now, while
        the node is awake for a message: what they send goes out with what it sent."""
        now = trio.current_time()
        due = [entry for entry, at in self._early.items() if at <= now]
        self._early_from = min((at for at in self._early.values() if at > now), default=math.inf)
        if not due:
            return
        timers = self._timers
        for entry in due:
            del self._early[entry]
            timers.remove(entry)
        heapq.heapify(timers)
        sleep = self._sleep
        if sleep is not None:
            sleep.deadline = timers[0][0] if timers else math.inf  # not for a timer gone
        for _, _, token in due:
            self._feed_one(TimerFired(token))
        self._feed_deferred()

    def _on_lost(self, peer_id: bytes) -> None:
        self._feed(ConnectionLost(peer_id))

    def _on_answers_drained(self, peer_id: bytes) -> None:
        """The peer's answer lane emptied (network.py): the core's next batch for it, once
        however often it empties before the core is fed. Called from within a write (a
        writer's, or a flush's): what the batch sends is queued for the peer's writer,
        which the lane wakes, never written from here, where a write of ours could cut
        into the one in progress."""
        if peer_id in self._drained:
            return
        self._drained.add(peer_id)
        event = AnswersDrained(peer_id)
        if self._pumping:
            self._deferred.append(event)
            return
        self._pumping = True
        try:
            self._feed_one(event)
            self._feed_deferred()
        finally:
            self._pumping = False

    def _on_answers_cancelled(self, peer_id: bytes) -> None:
        self._feed(AnswersCancelled(peer_id))

    # -- timers ---------------------------------------------------------------------------

    def _schedule(
        self,
        delay: float,
        token: Hashable,
        coalesce: bool = False,
        upkeep: bool = False,
        early: float = 0.0,
    ) -> None:
        deadline = trio.current_time() + delay
        if (coalesce or upkeep) and delay >= SLOW_TICK_AFTER:
            deadline = self.upkeep_deadline(delay)
        elif coalesce:
            # Upkeep timers fire on whole ticks of the shared (epoch) clock: a node's own
            # pings and probes, and its neighbours', then come together, and a process
            # wakes for them once instead of once each.
            deadline = math.ceil((deadline + self._epoch) / TIMER_TICK) * TIMER_TICK - self._epoch
        elif upkeep:
            phase = self._upkeep_phase
            deadline = math.ceil((deadline - phase) / TIMER_TICK) * TIMER_TICK + phase
        entry = (deadline, next(self._timer_seq), token)
        heapq.heappush(self._timers, entry)
        if early > 0:
            self._early[entry] = deadline - early
            self._early_from = min(self._early_from, deadline - early)
        sleep = self._sleep
        if sleep is not None and deadline < sleep.deadline:
            sleep.deadline = deadline  # the sleeper wakes for the new head, not now

    def upkeep_deadline(self, delay: float) -> float:
        """The first of this node's slow upkeep ticks at least `delay` seconds from now, in
        trio's clock: a task of the process that sleeps until it wakes with the node's
        own upkeep when that is due too (one wakeup, not two)."""
        phase = self._upkeep_phase
        deadline = trio.current_time() + delay
        return math.ceil((deadline - phase) / SLOW_TICK) * SLOW_TICK + phase

    async def _timer_loop(self) -> None:
        self._schedule(self.network.sweep_interval, _SWEEP, upkeep=True)
        timers = self._timers
        while True:
            while timers and timers[0][0] <= trio.current_time() + TIMER_SLACK:
                entry = heapq.heappop(timers)
                token = entry[2]
                if self._early:
                    self._early.pop(entry, None)
                if token is _SWEEP:
                    self.network.sweep()
                    self._schedule(self.network.sweep_interval, _SWEEP, upkeep=True)
                    continue
                self._feed(TimerFired(token))
            with trio.CancelScope(deadline=timers[0][0] if timers else math.inf) as self._sleep:
                await trio.sleep_forever()
            self._sleep = None

    # -- queries ----------------------------------------------------------------------------

    def connected_peers(self) -> list[bytes]:
        return self.network.connected_peers()

    def stats(self) -> dict[str, int]:
        out = self.counters.as_dict()
        out.update(self.network.stats())
        out["timers"] = len(self._timers)
        return out


def with_runtime_upkeep(config: NodeConfig, *, kernel_rtt: bool) -> NodeConfig:
    """`config` with the runtime's choices where it leaves them to us (None): the settled
    upkeep, and RTT samples from the kernel instead of PONGs when `kernel_rtt`; and no
    answer timer (the network reports when a peer has read its answers)."""
    membership = config.membership
    changes: dict[str, object] = {}
    if membership.settled_upkeep is None:
        changes["settled_upkeep"] = SETTLED_UPKEEP
    if membership.pong_rtt is None:
        changes["pong_rtt"] = not kernel_rtt
    if changes:
        config = replace(config, membership=replace(membership, **changes))
    if config.broadcast.answer_interval is not None:
        # The network reports drained lanes (AnswersDrained): no timer paces answers here.
        config = replace(config, broadcast=replace(config.broadcast, answer_interval=None))
    return config


def _show(peer_id: object) -> str:
    return show_peer(peer_id) if isinstance(peer_id, bytes) else repr(peer_id)
