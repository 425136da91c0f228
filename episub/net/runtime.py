"""The trio runtime: one NodeState driven over TCP.

The runtime only pumps (aioquic's protocol.py): every input reaches the core through
one function (`_pump`: feed it with `now`, carry out the outputs, then whatever input arose
meanwhile), and the outputs are carried out in one place (`_carry_out`):

- Send: the message is encoded once (wire.encode_item; a GOSSIP to seven peers is one
  encoding) and handed to the network, which queues it for the peer (network.py); once
  the input is fed, the network writes every peer's queue from the task that fed it
  (network.flush): a received burst is read, processed and forwarded in one wakeup.
  A Send marked `answer` (what the peer asked for) is not encoded here: the network
  takes it a batch at a time as the peer reads, within its budget (answers.py), in a
  task of its own: the step that reads a request only queues its first batch. When
  the peer's lane empties the core is fed AnswersDrained and makes its next batch of
  what the peer asked (proto/answers.py); when its connection goes, AnswersCancelled.
- ScheduleTimer: into the timer queue (timers.py), which decides the instant from the
  core's delay and hints; one task sleeps until the queue's head (in one cancel scope
  whose deadline moves: scheduling a timer never wakes the task).
- ClosePeer: the network closes that connection once its queue is drained.
- PeerMisbehaved: counted, and logged (logger "episub.net") at most once a minute per
  reason.
- The rest (events.AppEvent: Deliver, Published, DataLost, NeighborUp, ...): handed to
  `on_events` (the node), all of one input's together, in order.

A peer's requests (PULL, GRAFT over ranges, GETHELD, GETNODES, GETVIEW, GETTOPICS) are
charged to its work budget before the core sees them (`_admitted`): a request past it is
refused (a GRAFT keeps its link change and loses its ranges), and a peer that asks on
regardless is dropped.

Inputs come from the connections (ReceivedMany: the frames of one read; ConnectionLost;
AnswersDrained, AnswersCancelled), the timer task (TimerFired) and the API (`input`:
JoinTopic, LeaveTopic, Publish, ...). The core is called from one task at a time and never
re-entered: an input that arises while outputs are carried out (a queue overflow's
ConnectionLost) is fed right after them.

Containment, the second line behind the core's own checks: an exception out of the core
(or out of carrying out its outputs) on any path never ends the node. It is counted
(`core_errors`) and logged with its traceback at most once a minute per kind; what the
core output before it still goes out; a peer whose frame caused it is cut off; a timer it
failed on fires again `TIMER_RETRY` later (its outputs, its re-arming among them, are
dropped); a command's caller gets `CoreError` (a `LocalProtocolError`, the caller's
misuse, reaches it as it is). The node carries on.

`now` for the core is trio's clock plus a fixed offset to the Unix epoch, taken once: it
is monotonic, as the core needs, and the timestamps the core stamps on messages read as
wall-clock milliseconds, as users of the timestamp expect.

Every task lives in the runtime's nursery, which the caller's cancellation does not reach:
the runtime ends with `shutdown()`, which leaves the topics and closes gracefully first.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import replace
from functools import partial
from operator import itemgetter
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
from episub.net.timers import SLOW_TICK, TIMER_RETRY, TimerQueue
from episub.proto import messages as m
from episub.proto.config import NodeConfig
from episub.proto.errors import LocalProtocolError
from episub.proto.events import (
    AnswersCancelled,
    AnswersDrained,
    AppEvent,
    ClosePeer,
    ConnectionLost,
    Deliver,
    InEvent,
    LeaveTopic,
    OutEvent,
    PeerMisbehaved,
    Received,
    ReceivedMany,
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
# The network's sweep (idle and silent connections) rides on the timer heap, on the
# node's upkeep ticks: a token of the runtime's own, never fed to the core.
_SWEEP = object()

# What a request costs a peer's work budget (answers.REQUEST_WORK_PER_SECOND), in store
# rows looked at and answered (a GETHELD span). A seq of a PULL or GRAFT is one dict
# lookup, a guessed 1/8 of that (its bytes are charged to the answer budget apart). A
# view, node or topic list is at most MAX_PEERS_PER_MESSAGE (256) entries from memory:
# 16, a guess.
_SEQS_PER_WORK = 8
_LIST_COST = 16
# Request work one step of a connection's reader hands the core: four GETHELD pages or
# eight 1,024-seq PULLs (a step of a few ms); what a read holds past it waits for the
# next step, other tasks first (the agent, honest links). Guess; at least one request goes.
STEP_REQUEST_WORK = 1024
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
_REQUEST_TYPES = frozenset(_REQUEST_COSTS)
_message_of = itemgetter(1)  # of a (topic, message) item


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
        on_events: Callable[[list[AppEvent]], None],
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
        self._epoch = _epoch()
        self._timers = TimerQueue(node_id=my_id, epoch=self._epoch)
        self._sleep: trio.CancelScope | None = None  # the timer task's, until the head
        self._answer_keys = itertools.count()  # answers that no repeat merges with
        # Inputs that arose while the core was being fed (a queue overflow's ConnectionLost,
        # a drained answer lane): fed right after, never re-entering the core.
        self._deferred: deque[InEvent] = deque()
        self._drained: set[bytes] = set()  # peers with a deferred AnswersDrained
        self._pumping = False
        self._run_scope = trio.CancelScope(shield=True)
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
                    self._pump(LeaveTopic(topic), self.now())
                self._write()
                await self.network.close()
        finally:
            self.network.closing = True
            self._run_scope.cancel()

    # -- the pump: the one way into the core ------------------------------------------------

    def input(self, event: InEvent) -> None:
        """Feed the core a command (JoinTopic, Publish, ...) and carry out its outputs. What
        it sends goes out gathered with the application's burst, if any. The caller's
        misuse raises LocalProtocolError; a failure of the core itself is counted and
        raises CoreError. Either way the node carries on."""
        failure = self._pump(event, self.now(), command=True)
        self._write(gather=True)
        if failure is None:
            return
        if isinstance(failure, LocalProtocolError):
            raise failure
        raise CoreError(f"the core failed on {type(event).__name__}: {failure!r}") from failure

    def _pump(self, event: InEvent, now: float, *, command: bool = False) -> Exception | None:
        """Feed the core `event` at `now` and carry out its outputs, then every input that
        arose meanwhile; the caller writes what they sent (network.flush). The core is
        never re-entered: an input that arises while it is fed waits its turn. Returns the
        core's exception on `event`, or None; it is contained (`_feed`), never raised."""
        if self._pumping:
            self._deferred.append(event)
            return None
        self._pumping = True
        try:
            failure = self._feed(event, now, command)
            deferred = self._deferred
            while deferred:
                event = deferred.popleft()
                if type(event) is AnswersDrained:
                    self._drained.discard(event.peer)
                self._feed(event, self.now(), False)
        finally:
            self._pumping = False
        return failure

    def _write(self, *, gather: bool = False) -> None:
        """Write what the inputs fed sent (network.flush): from the outermost caller only,
        once the input that was being fed, and any that arose meanwhile, are carried out.
        `gather`: for the application's publishes (Nagle's rule, connection.GATHER_WAIT)."""
        if not self._pumping:
            self.network.flush(gather=gather)

    def _feed(self, event: InEvent, now: float, command: bool) -> Exception | None:
        """One input into the core and its outputs carried out; a failure is counted and
        logged, unless it is a `command`'s LocalProtocolError (the caller's misuse)."""
        outputs: list[OutEvent] = []
        failure: Exception | None = None
        try:
            if type(event) is ReceivedMany:  # a read: most inputs, and no match needed
                self.state.handle_received(event.peer, event.items, now, outputs)
            else:
                self.state.handle(event, now, outputs)
        except Exception as exc:
            failure = exc
            if not (command and isinstance(exc, LocalProtocolError)):  # else the caller's misuse
                self._core_error(event, exc)
            if type(event) is TimerFired:
                # Its outputs, its re-arming among them, are dropped: it fires again later,
                # or a periodic timer (stabilisation, pings) would stop for good after one
                # failure. What any other input output before the failure still goes out:
                # it is what the core changed.
                self._schedule_own(TIMER_RETRY, event.token)
                return failure
        try:
            self._carry_out(outputs)
        except Exception as exc:
            self._core_error(event, exc)
        return failure

    def _core_error(self, event: InEvent, exc: Exception) -> None:
        """Count and log (at most once a minute per kind) a failure of the core."""
        self.counters.core_errors += 1
        what = type(event).__name__
        match event:
            case Received(message=message):
                what += f" {type(message).__name__}"
            case ReceivedMany(items=items):
                what += f" {type(items[0][1]).__name__}" + (", ..." if len(items) > 1 else "")
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
        """The one place outputs are carried out; the API's events go to `on_events`, all of
        one input's together, in order."""
        encoded: dict[tuple[str | None, int], bytes] = {}  # one encoding per message object
        events: list[AppEvent] = []
        send = self.network.send
        me = self.me
        # A message pushed to several peers comes as Sends one after the other: the last
        # one's encoding is reused without a key made and looked up.
        last_message: object = None
        last_topic: str | None = None
        last_item = b""
        for out in outputs:
            if type(out) is Send:  # most outputs are: by identity, ahead of the match
                if out.answer or out.peer == me:
                    self._send_aside(out)
                    continue
                message = out.message
                topic = out.topic
                if message is not last_message or topic != last_topic:
                    cache_key = (topic, id(message))
                    item = encoded.get(cache_key)
                    if item is None:
                        item = self._encode(topic, message, out.peer)
                        if item is None:
                            continue
                        encoded[cache_key] = item
                    last_message, last_topic, last_item = message, topic, item
                send(out.peer, last_item)
                continue
            match out:
                case Deliver():  # the next most: a relay's delivery of what it forwards
                    events.append(out)
                case ScheduleTimer():
                    self._schedule(out)
                case ClosePeer(peer=peer):
                    self.network.close_peer(peer)
                case PeerMisbehaved():
                    self._misbehaved(out)
                case _:
                    events.append(out)
        if events:
            self._on_events(events)

    def _misbehaved(self, out: PeerMisbehaved) -> None:
        self.counters.peer_misbehaved += 1
        # One line a minute per kind of reason: the reason without what it quotes of the
        # peer's message (sizes, hop counts, ids, topics), which the peer could vary at will.
        self._peer_log.log(
            _QUOTED.sub("_", out.reason),
            trio.current_time(),
            logging.WARNING,
            "peer %s misbehaved: %s",
            _show(out.peer),
            out.reason,
        )

    def _send_aside(self, out: Send) -> None:
        """A Send that is not queued as it is (`_carry_out` queues the rest): one to
        ourselves, dropped, or an answer, which waits in the peer's lane."""
        if out.peer == self.me:
            self.counters.dropped["to_self"] += 1
            log.error("the core sent %s to ourselves; dropped", type(out.message).__name__)
            return
        self._answer(out)

    def _answer(self, out: Send) -> None:
        """An answer waits in the peer's lane as the message the core gave (the store's bytes,
        not a copy) and is encoded when the network takes it."""
        message = out.message
        if type(message) is m.Gossip:
            key: Hashable = (out.topic, message.id)  # a repeat of a waiting answer merges
            size = len(message.raw) + _GOSSIP_OVERHEAD
        elif type(message) is m.History:
            # A repeated PULL packs the same messages (the store's bytes objects, whose
            # hashes are kept): it merges with the pack still waiting.
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
    ) -> tuple[list[tuple[str | None, m.PeerMessage]], FrameItems | None]:
        """`items` less the requests the peer's work budget refuses (a refused GRAFT keeps
        its link change: it comes in without ranges), up to STEP_REQUEST_WORK of requests
        admitted: from the request past that on, the items wait for a later step (the
        second value). None when the peer is dropped."""
        if _REQUEST_TYPES.isdisjoint(map(type, map(_message_of, items))):
            return items, None  # no request (most reads): looked over in C, not item by item
        refused: list[int] = []
        rest: FrameItems | None = None
        step = 0
        for i, (_, message) in enumerate(items):
            cost = _REQUEST_COSTS.get(type(message))
            if cost is None:
                continue
            work = cost(message)
            if not work:
                continue
            if step >= STEP_REQUEST_WORK:
                items, rest = items[:i], items[i:]
                break
            verdict = self.network.charge(peer_id, work)
            if verdict is Verdict.OVER:
                return [], None
            if verdict is Verdict.THROTTLED:
                refused.append(i)
            else:
                step += work
        if not refused:
            return items, rest
        kept = list(items)
        for i in reversed(refused):
            topic, message = kept[i]
            if type(message) is m.Graft:
                kept[i] = (topic, m.Graft())
            else:
                del kept[i]
        return kept, rest

    # -- what calls the pump: the network, the timer task, the API -------------------------

    def _on_frames(
        self, conn: Connection, frames: list[FrameItems], resumed: bool
    ) -> FrameItems | None:
        """Every frame of one read goes into the core as one input (ReceivedMany), at the
        read's own time; timers that may fire early and may by now fire in its wakeup.
        Past a step's share of requests (`_admitted`), the rest of the read is returned,
        to come back `resumed` after the connection's reader let other tasks run."""
        counters = self.counters
        items = frames[0] if len(frames) == 1 else [item for frame in frames for item in frame]
        if not resumed:
            counters.frames_in += len(frames)
            counters.messages_in += len(items)
            counters.bytes_in += conn.take_bytes_in()
        peer_id = conn.peer.id
        received = conn.last_received  # trio.current_time() as the read handed them over
        now = received + self._epoch
        if self._kernel_rtt and conn.rtt_due <= received:
            # First, so that a PONG from a peer measured nowhere else finds it measured.
            conn.rtt_due = received + KERNEL_RTT_INTERVAL
            rtt = conn.kernel_rtt()
            if rtt is not None:
                self._pump(RttMeasured(peer_id, rtt), now)
        items, rest = self._admitted(peer_id, items)
        if not items:
            return rest
        if self._pump(ReceivedMany(peer_id, items), now) is not None:
            conn.abort("core error")  # a core bug met by a peer's input: the peer is cut off
            rest = None
        early = self._timers.take_early(received)
        if early:
            for token in early:
                self._pump(TimerFired(token), now)
            self._wake_for_head()
        self._write()
        return rest

    def _on_lost(self, peer_id: bytes) -> None:
        self._pump(ConnectionLost(peer_id), self.now())
        self._write()

    def _on_answers_drained(self, peer_id: bytes) -> None:
        """The peer's answer lane emptied (network.py): the core's next batch for it, once
        however often it empties before the core is fed. Called from the network's answer
        task, which encodes and writes the batch in its later steps, never from here."""
        if peer_id in self._drained:
            return
        if self._pumping:
            self._drained.add(peer_id)
        self._pump(AnswersDrained(peer_id), self.now())

    def _on_answers_cancelled(self, peer_id: bytes) -> None:
        self._pump(AnswersCancelled(peer_id), self.now())
        self._write()

    # -- timers: the queue decides when (timers.py), this task only sleeps until then -------

    def _schedule(self, timer: ScheduleTimer) -> None:
        deadline = self._timers.schedule(
            trio.current_time(),
            timer.delay,
            timer.token,
            coalesce=timer.coalesce,
            upkeep=timer.upkeep,
            early=timer.early,
        )
        sleep = self._sleep
        if sleep is not None and deadline < sleep.deadline:
            sleep.deadline = deadline  # the sleeper wakes for the new head, not now

    def _schedule_own(self, delay: float, token: Hashable, *, upkeep: bool = False) -> None:
        """A timer of the runtime's own (the sweep, a failed timer's retry)."""
        self._schedule(ScheduleTimer(delay, token, upkeep=upkeep))

    def _wake_for_head(self) -> None:
        sleep = self._sleep
        if sleep is not None:
            sleep.deadline = self._timers.head  # not for a timer taken early

    def upkeep_deadline(self, delay: float) -> float:
        """The first of this node's slow upkeep ticks at least `delay` seconds from now, in
        trio's clock: a task of the process that sleeps until it wakes with the node's
        own upkeep when that is due too (one wakeup, not two)."""
        return self._timers.upkeep_deadline(trio.current_time(), delay)

    async def _timer_loop(self) -> None:
        self._schedule_own(self.network.sweep_interval, _SWEEP, upkeep=True)
        timers = self._timers
        while True:
            while due := timers.pop_due(trio.current_time()):
                for token in due:
                    if token is _SWEEP:
                        self.network.sweep()
                        self._schedule_own(self.network.sweep_interval, _SWEEP, upkeep=True)
                    else:
                        self._pump(TimerFired(token), self.now())
                self._write()
            with trio.CancelScope(deadline=timers.head) as self._sleep:
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


def _epoch() -> float:
    """Wall-clock seconds at trio's clock zero, from the closest of a few reads of both
    clocks: a process preempted between its reads (a busy executor) would otherwise stamp
    behind its neighbours by the preemption, and a stamp decides whether a message came
    before or after another node's join (ordering.py)."""
    reads = []
    for _ in range(5):
        before = time.time()
        monotonic = trio.current_time()
        after = time.time()
        reads.append((after - before, (before + after) / 2 - monotonic))
        if after - before < 0.0001:
            break
    return min(reads)[1]
