"""The public async API: one episub node, as a trio async context manager.

    async with Node(key=KEY, listen="127.0.0.1:0") as node:
        await node.join("prices", bootstrap=["10.0.0.5:7000"])
        async with node.subscribe("prices") as sub:
            await node.publish("prices", b"42")
            async for item in sub:
                ...

Entering starts the listener and the runtime (episub.net); leaving leaves every topic
(LEAVE is sent and flushed within `CLOSE_TIMEOUT`), closes every connection, and ends
every subscription. A node's id is `b"host:port/<random tag>"`, new on every start.

Choices the API makes:
- A node's own publishes reach its own subscribers (and its retention store) too, as a
  Kafka consumer sees what its own process produced.
- `join` dials every bootstrap address at once (trio's open_tcp_stream does the same with
  addresses of one host); once one answers, the others get `BOOTSTRAP_GRACE` to answer as
  well, then are cancelled. The node's own address is skipped, so every node of a
  deployment can be given the same bootstrap list.
- `publish` paces a burst: while a neighbour's send queue is more than half full, it waits
  for the queue to drain (up to `PUBLISH_WAIT`, after which that neighbour is dropped as
  too slow), so a fast publisher neither overflows a live peer's queue nor loses the link.
- A topic left with no neighbour and no passive peer goes back to its bootstrap addresses:
  at each of the core's recovery attempts (`Isolated`, with backoff) they are dialled
  again and the ids they answer with now (a contact that restarted has a new one) are
  handed to the core (`RefreshContacts`), beside the peers the core itself remembers.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from random import Random
from types import TracebackType
from typing import Literal

import trio

from episub.net.handshake import HANDSHAKE_TIMEOUT, HandshakeError, check_key
from episub.net.link_delay import LinkDelay
from episub.net.network import MAX_CONNECTIONS
from episub.net.peer_id import (
    Address,
    PeerIdError,
    format_address,
    make_peer_id,
    parse_address,
    parse_peer_id,
)
from episub.net.runtime import DIAL_TIMEOUT, Runtime
from episub.proto.config import NodeConfig
from episub.proto.envelope import Record
from episub.proto.errors import LocalProtocolError, MessageTooLarge
from episub.proto.events import (
    AlreadyPublished,
    AnswerHeld,
    AskHeld,
    AskTopics,
    AskView,
    DataLost,
    Deliver,
    Fetch,
    HeldAsked,
    HeldReport,
    HistoryAsked,
    Isolated,
    JoinTopic,
    LeaveTopic,
    NeighborUp,
    OutEvent,
    Published,
    PublishMany,
    Recovered,
    RefreshContacts,
    ServeHistory,
    TopicsReport,
    ViewReport,
)
from episub.proto.messages import (
    MAX_HELD_SPANS,
    Envelope,
    GetHeld,
    Held,
    HeldSpan,
    LinkKind,
    Signature,
    View,
    check_topic_name,
)
from episub.proto.signing import Signer
from episub.retention import RetentionConfig, RetentionStore, Span
from episub.subscription import Lost, Message, Subscription

__all__ = [
    "BOOTSTRAP_GRACE",
    "CLOSE_TIMEOUT",
    "CONTROL_PREFIX",
    "PUBLISH_WAIT",
    "SUBSCRIPTION_BUFFER",
    "BootstrapError",
    "Neighbor",
    "Node",
    "Receipt",
]

log = logging.getLogger("episub.node")

# After the first bootstrap contact answers, how long the others may still answer.
BOOTSTRAP_GRACE = 0.25  # trio's happy_eyeballs_delay default: "is the next one coming?"
# Leaving on exit: LEAVE out, flushed, EOFs exchanged. One RTT when all is well.
CLOSE_TIMEOUT = 2.0  # guess: covers a slow WAN round trip or two; exit stays prompt
# join() returns once the topic has a first neighbour, so that a publish right after it
# reaches someone; a JOIN walk plus a NEIGHBOR exchange is a few RTTs.
JOIN_TIMEOUT = 10.0  # guess: = DIAL_TIMEOUT, far above a few loopback or LAN RTTs
# fetch(): how long one neighbour may take to start answering a PULL, and how long a
# burst of answers may pause before the next neighbour is asked for what is still missing.
FETCH_RETRY = 1.0  # guess: a PULL round trip on a busy LAN, with room
FETCH_QUIET = 0.1  # guess: answers to one PULL leave the peer back to back
FETCH_TIMEOUT = 10.0  # guess: = JOIN_TIMEOUT; a Spark task waits this long at most per range
# Seqs asked of one neighbour at a time: its answers must fit its send queue to us with
# room for live traffic (SEND_QUEUE_CAP is 4,096 messages), or it drops the link.
FETCH_CHUNK = 1024
FETCH_MAX_SPAN = 1_000_000  # seqs one fetch may span: bounds the gap scan's work
# How long a publish waits for a neighbour's send queue to drain below half its cap
# before that neighbour is declared too slow and dropped (network.wait_for_room).
PUBLISH_WAIT = 5.0  # guess: = the ping timeout; a live peer on a LAN drains far sooner
# Records of one publish_many that go into the core as one input: with a neighbour's send
# queue at most half full (wait_for_room), a chunk fits the rest of it (SEND_QUEUE_CAP is
# 4,096 messages), so a batch never overflows the queue of a neighbour that keeps up.
PUBLISH_CHUNK = 1024
SUBSCRIPTION_BUFFER = 1024  # guess: ~a second of a busy topic; trio has no default on purpose
VIEW_TIMEOUT = 2.0  # guess: a dial plus a round trip on a LAN, with room; view_of's wait
HELD_TIMEOUT = 2.0  # guess: as VIEW_TIMEOUT, per page of a held_by answer
HELD_MAX_PAGES = 400  # pages one held_by follows: 102,400 publishers = max_publishers
# Catch-up with a neighbour whose link came up (see _catch_up): how many run at once, and
# how long one may take in all. A link is lost with its send queue (a peer too slow for a
# burst), and nothing announces those messages again, so the link's return is when the two
# ends compare what they hold and pull the difference.
CATCH_UP_AT_ONCE = 4  # guess: a few neighbours' holdings compared at a time
CATCH_UP_TIMEOUT = 60.0  # guess: several FETCH_TIMEOUTs; a catch-up is background work
# Stamps are the publishers' clocks, the join time ours: asked from a little before it.
CATCH_UP_CLOCK_SLACK_MS = 2000  # guess: NTP keeps a cluster's hosts within milliseconds
# Named streams whose publisher starts with this carry a deployment's own bookkeeping (a
# Spark sink's batch index): held, relayed and readable by range like any message, never
# delivered to subscriptions or listeners. Application streams must not use the prefix.
CONTROL_PREFIX = b"_episub/"
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


class BootstrapError(ConnectionError):
    """No bootstrap address could be reached; `failures` maps each address to its error."""

    def __init__(self, failures: Mapping[str, BaseException]) -> None:
        self.failures = dict(failures)
        detail = "; ".join(f"{address}: {error}" for address, error in self.failures.items())
        super().__init__(f"could not reach any bootstrap address ({detail})")


@dataclass(frozen=True, slots=True)
class Receipt:
    """Where a publish went: the message id, and its place (publisher, seq).

    duplicate: the place was taken already and nothing was published; `id` is then the
    message that holds it, when this node still caches it (else None). `id` is None too
    for a named-stream publish held behind an earlier place that has not arrived yet."""

    id: bytes | None
    publisher: bytes
    seq: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class Neighbor:
    """One link of a topic's active view, as `Node.neighbors` reports it."""

    peer_id: bytes
    address: str  # "host:port" from the peer id
    kind: Literal["rand", "near"]  # GoCast: a random link, or one of the nearest by RTT
    role: Literal["eager", "lazy"]  # Plumtree: pushes payloads, or only announces ids
    rtt_ms: float | None  # smoothed RTT; None until a ping was answered


class Node:
    """One episub node. Use as `async with Node(key=...) as node:`.

    key: the deployment's shared 32-byte key; peers without it cannot connect.
    listen: "host:port" to listen on; port 0 picks a free port.
    config: protocol parameters (episub.proto.config).
    link_delay: optional f(my_id, peer_id) -> seconds to hold back every frame sent to
        that peer (emulated network delay, for tests and demos; see zones_link_delay).
    retention: bounds of the store behind `retained()`.
    advertise: the host peers should dial, when `listen` is a wildcard like 0.0.0.0.
    handshake_timeout: a new connection must prove the key within this (default 5 s).
    dial_timeout: a TCP connect to a peer must succeed within this (default 10 s).
    seed: seeds the protocol's random choices (default: fresh randomness).
    encrypt: seal every frame after the handshake (ChaCha20-Poly1305, episub.net.sealing;
        default on). Off only on a trusted network; all nodes must agree.
    max_connections: authenticated connections held at once (default 512); past it an
        inbound connection is refused after its handshake, and counted.
    sign: signed publishing (episub.proto.signing; default off): the node draws an
        Ed25519 identity, its id is bound to it, it signs what it publishes and drops
        (and counts, `bad_signatures`) any message not signed by its publisher. All
        nodes must agree; a signing and a non-signing node fail their handshake.
    """

    def __init__(
        self,
        *,
        key: bytes,
        listen: str = "127.0.0.1:0",
        config: NodeConfig | None = None,
        link_delay: LinkDelay | None = None,
        retention: RetentionConfig | None = None,
        advertise: str | None = None,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        dial_timeout: float = DIAL_TIMEOUT,
        seed: int | None = None,
        encrypt: bool = True,
        max_connections: int = MAX_CONNECTIONS,
        sign: bool = False,
    ) -> None:
        self._key = check_key(key)
        if not isinstance(sign, bool):
            raise TypeError(f"sign must be True or False, not {sign!r}")
        self._sign = sign
        self._listen = parse_address(listen, allow_port_zero=True)
        host = advertise if advertise is not None else self._listen.host
        if host in _WILDCARD_HOSTS:
            raise ValueError(
                f"listening on {listen!r} needs advertise= the host peers should dial "
                "(peer ids carry it)"
            )
        self._advertise = parse_address(format_address(host, 1)).host
        self._config = config if config is not None else NodeConfig()
        self._link_delay = link_delay
        self._retention = RetentionStore[_Kept](retention or RetentionConfig())
        self._handshake_timeout = handshake_timeout
        self._dial_timeout = dial_timeout
        self._encrypt = encrypt
        self._max_connections = max_connections
        self._seed = seed if seed is not None else secrets.randbits(64)
        self._runtime: Runtime | None = None
        self._address = ""
        self._subscriptions: dict[str, list[Subscription]] = {}
        self._listeners: dict[str, list[Callable[[Message | Lost], None]]] = {}
        self._listener_errors = 0
        # join() waiting for the topic's first neighbour: the event, and who it was.
        self._first_neighbor: dict[str, tuple[trio.Event, list[bytes]]] = {}
        # Bootstrap addresses per joined topic, dialled again when the topic is isolated;
        # the topics whose addresses are being dialled now.
        self._bootstrap: dict[str, list[Address]] = {}
        self._refreshing: set[str] = set()
        self._nursery: trio.Nursery | None = None
        # Fetches in progress, per (topic, publisher): the seqs each waits for, and an event
        # set when one of those arrives (live messages of the publisher do not count).
        self._fetching: dict[tuple[str, bytes], list[_FetchWaiter]] = {}
        self._lifetime_cm: AbstractAsyncContextManager[Node] | None = None
        # view_of() calls waiting for a VIEW, per (topic, peer): one answer serves them all.
        self._view_waiters: dict[tuple[str, bytes], list[_ViewWaiter]] = {}
        # held_by() and topics_of() calls waiting for their answer, by nonce / by peer.
        self._held_waiters: dict[int, _HeldWaiter] = {}
        self._held_nonces = itertools.count(1)
        self._topics_waiters: dict[bytes, list[_TopicsWaiter]] = {}
        # When each topic was joined (wall clock, ms): a catch-up asks only for what was
        # published since, what this node should hold. (topic, peer) catch-ups pending or
        # running, one per link (so bounded by topics times the active view), each with
        # whether the link came up again since it started.
        self._joined_ms: dict[str, int] = {}
        self._catching_up: dict[tuple[str, bytes], bool] = {}
        self._catch_up_locks: dict[str, trio.Lock] = {}  # topics with a catch-up pending
        self._catch_up_slots = trio.CapacityLimiter(CATCH_UP_AT_ONCE)
        self._catch_ups = 0
        self._caught_up = 0

    # -- lifetime ---------------------------------------------------------------------------

    async def __aenter__(self) -> Node:
        if self._lifetime_cm is not None:
            raise LocalProtocolError("a Node can be entered once")
        self._lifetime_cm = self._lifetime()
        return await self._lifetime_cm.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._lifetime_cm is not None
        return await self._lifetime_cm.__aexit__(exc_type, exc, tb)

    @asynccontextmanager
    async def _lifetime(self) -> AsyncIterator[Node]:
        # The body's exception is re-raised outside the nursery, so that the caller sees it
        # as raised, not wrapped in an ExceptionGroup by the nursery.
        body_error: BaseException | None = None
        async with trio.open_nursery() as nursery:
            listeners = await self._open_listeners()
            port = listeners[0].socket.getsockname()[1]
            signer = Signer.generate() if self._sign else None
            tag = None if signer is None else signer.tag.decode("ascii")
            my_id = make_peer_id(self._advertise, port, tag)
            self._address = format_address(self._advertise, port)
            runtime = Runtime(
                key=self._key,
                my_id=my_id,
                config=self._config,
                rng=Random(self._seed),
                on_events=self._on_events,
                link_delay=self._link_delay,
                handshake_timeout=self._handshake_timeout,
                dial_timeout=self._dial_timeout,
                encrypt=self._encrypt,
                max_connections=self._max_connections,
                signer=signer,
            )
            await nursery.start(runtime.run, listeners)
            self._runtime = runtime
            self._nursery = nursery
            try:
                yield self
            except BaseException as exc:
                body_error = exc
            finally:
                await runtime.shutdown(CLOSE_TIMEOUT)
                for subs in self._subscriptions.values():
                    for sub in subs:
                        sub.close()
                self._runtime = None
                self._nursery = None
                nursery.cancel_scope.cancel()
        if body_error is not None:
            raise body_error

    async def _open_listeners(self) -> list[trio.SocketListener]:
        host, port = self._listen.host, self._listen.port
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {self._listen}: {exc.strerror}") from exc
        ports = {listener.socket.getsockname()[1] for listener in listeners}
        if len(ports) > 1:
            for listener in listeners:
                await listener.aclose()
            raise ValueError(
                f"{host!r} resolves to several addresses that got different free ports; "
                "listen on one IP address, or give a port"
            )
        return listeners

    def _running(self) -> Runtime:
        if self._runtime is None:
            raise LocalProtocolError(
                "the node is not running: use it inside `async with Node(...)`"
            )
        return self._runtime

    # -- identity ---------------------------------------------------------------------------

    @property
    def id(self) -> bytes:
        """This run's peer id, b"host:port/tag"."""
        return self._running().me

    @property
    def address(self) -> str:
        """ "host:port" that peers dial (and bootstrap lists name)."""
        self._running()
        return self._address

    # -- topics -----------------------------------------------------------------------------

    async def join(
        self, topic: str, bootstrap: Iterable[str] = (), *, timeout: float = JOIN_TIMEOUT
    ) -> None:
        """Join `topic` through any of the `bootstrap` addresses ("host:port").

        An empty list (or one naming only this node) starts the topic's overlay here.
        Otherwise this returns once the topic has its first neighbour, so that a publish
        right after it reaches the overlay. Raises BootstrapError, with every address's
        failure, when none answers; TimeoutError when no neighbour came within `timeout`
        seconds (the node stays joined and keeps trying).
        """
        runtime = self._running()
        check_topic_name(topic)
        if isinstance(bootstrap, str | bytes):
            raise TypeError(f"bootstrap must be a list of 'host:port' strings, not {bootstrap!r}")
        if topic in runtime.state.topics():
            raise LocalProtocolError(f"already joined topic {topic!r}")
        own = parse_address(self._address)
        addresses = list(dict.fromkeys(a for a in map(parse_address, bootstrap) if a != own))
        contacts: list[bytes] = []
        if addresses:
            contacts = await self._reach(runtime, addresses)
        else:
            await trio.lowlevel.checkpoint()
        up, who = self._first_neighbor[topic] = (trio.Event(), [])
        self._joined_ms[topic] = int(time.time() * 1000)
        runtime.input(JoinTopic(topic, tuple(dict.fromkeys(contacts))))
        self._bootstrap[topic] = addresses
        if not contacts:
            return
        with trio.move_on_after(timeout):
            await up.wait()
            # Our answer that made the link is on its way before we return, so that the
            # neighbour holds the link too by the time the caller's next step reaches it.
            await runtime.network.flushed(who[0])
            return
        raise TimeoutError(
            f"joined topic {topic!r} through {', '.join(map(str, addresses))} but no "
            f"neighbour came within {timeout} s; the node stays joined and keeps trying"
        )

    async def _reach(self, runtime: Runtime, addresses: list[Address]) -> list[bytes]:
        found: dict[Address, bytes] = {}
        failures: dict[str, BaseException] = {}
        remaining = len(addresses)
        async with trio.open_nursery() as nursery:

            async def grace() -> None:
                await trio.sleep(BOOTSTRAP_GRACE)
                nursery.cancel_scope.cancel()

            async def attempt(address: Address) -> None:
                nonlocal remaining
                try:
                    found[address] = await runtime.connect(address)
                    if len(found) == 1:
                        nursery.start_soon(grace)
                except (OSError, HandshakeError) as exc:
                    failures[str(address)] = exc
                finally:
                    remaining -= 1
                    if remaining == 0:
                        nursery.cancel_scope.cancel()

            for address in addresses:
                nursery.start_soon(attempt, address)
        if not found:
            raise BootstrapError(failures)
        return [found[a] for a in addresses if a in found]

    async def leave(self, topic: str) -> None:
        """Leave `topic`: neighbours are told (LEAVE); subscriptions stay open."""
        runtime = self._running()
        await trio.lowlevel.checkpoint()
        runtime.input(LeaveTopic(topic))
        self._bootstrap.pop(topic, None)
        self._joined_ms.pop(topic, None)

    async def _refresh_contacts(self, topic: str, addresses: list[Address]) -> None:
        """Dial a topic's bootstrap addresses again and hand the core the ids they answer
        with now; one at a time per topic, the core's backoff paces the attempts."""
        try:
            runtime = self._running()
            try:
                contacts = await self._reach(runtime, addresses)
            except BootstrapError as exc:
                log.info("topic %r has no neighbour; %s", topic, exc)
                return
            if topic in runtime.state.topics():
                runtime.input(RefreshContacts(topic, tuple(dict.fromkeys(contacts))))
        finally:
            self._refreshing.discard(topic)

    async def publish(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None = None,
    ) -> bytes:
        """Publish `value` on a joined topic; returns the message id.

        Raises MessageTooLarge over the config's max_message_size (value + key + headers).
        `publish_record` says which sequence number the message got as well.
        """
        receipt = await self.publish_record(topic, value, key, headers)
        assert receipt.id is not None, "our own stream has no taken places"
        return receipt.id

    async def publish_record(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None = None,
        *,
        stream: tuple[bytes, int] | None = None,
        timestamp_ms: int | None = None,
    ) -> Receipt:
        """Publish as `publish` does, and say where the message went: its publisher and seq.

        stream: (publisher, seq) to publish at that place of a stream the caller names
        instead of this node's own (publisher: up to 64 bytes, not this node's id). A
        place taken already, here or anywhere this node heard of, publishes nothing and
        the receipt says `duplicate`: a Spark sink names each row's place after its query,
        batch, partition and row number, so a retried task re-publishes nothing.
        timestamp_ms: a named place's stamp (default: now), so that a place written again
        is the same message (same id) wherever it is written.
        """
        record = Record(value, key, headers, stream, timestamp_ms)
        return (await self.publish_many(topic, (record,)))[0]

    async def publish_many(self, topic: str, records: Iterable[Record | bytes]) -> list[Receipt]:
        """Publish `records` (episub.Record, or bytes for a bare value) in order on a joined
        topic, as `publish_record` does each; returns their receipts in the same order.

        Cheaper per record than `publish_record` when a burst is at hand: the records go
        into the node's core together (ids, envelopes and frames made in one pass) and
        out to the neighbours in one write per neighbour. All or none: a record too large
        (MessageTooLarge, naming it) or naming this node's own stream refuses the batch
        before anything is published. Records go into the core PUBLISH_CHUNK at a time,
        each chunk after the neighbours' send queues have room for it.
        """
        runtime = self._running()
        checked = [r if type(r) is Record else Record(r) for r in records]  # type: ignore[arg-type]
        if not checked:
            return []
        await trio.lowlevel.checkpoint()
        me = runtime.me
        limit = self._config.broadcast.max_message_size
        count = len(checked)
        for i, record in enumerate(checked):
            if record.stream is not None and record.stream[0] == me:
                raise ValueError("this node's own stream is numbered by the node: name another")
            if record.size > limit:
                where = f"record {i} of {count}: " if count > 1 else ""
                raise MessageTooLarge(
                    f"{where}message of {record.size} bytes exceeds max_message_size "
                    f"({limit} bytes) on topic {topic!r}"
                )
        receipts: list[Receipt] = []
        for start in range(0, count, PUBLISH_CHUNK):
            chunk = tuple(checked[start : start + PUBLISH_CHUNK])
            # Flow control: a burst waits for its neighbours' queues instead of overflowing them.
            await runtime.network.wait_for_room(PUBLISH_WAIT)
            receipts += _receipts(chunk, runtime.input(PublishMany(topic, chunk)))
        return receipts

    def subscribe(self, topic: str, buffer: int = SUBSCRIPTION_BUFFER) -> Subscription:
        """Items of `topic` (Message, Lagged, Lost) from entering `async with` on.

        The topic need not be joined yet: items flow while it is.
        """
        self._running()
        return Subscription(topic, buffer, self._add_subscription, self._remove_subscription)

    @contextmanager
    def listen(self, topic: str, callback: Callable[[Message | Lost], None]) -> Iterator[None]:
        """Call `callback(item)` for each item of `topic` (Message, Lost) while in the block.

        For in-process components that keep state, such as a configuration replica: the
        call happens as the node delivers the message, inside its event processing, so it
        costs no task switch and no buffer (nothing lags), but it must be quick and must
        not block. An exception it raises is logged and counted (`listener_errors`), and
        the node carries on. Applications use `subscribe`.
        """
        self._running()
        check_topic_name(topic)
        listeners = self._listeners.setdefault(topic, [])
        listeners.append(callback)
        try:
            yield
        finally:
            listeners.remove(callback)
            if not listeners:
                self._listeners.pop(topic, None)

    def _tell_listeners(self, topic: str, item: Message | Lost) -> None:
        for callback in self._listeners.get(topic, ()):
            try:
                callback(item)
            except Exception:
                self._listener_errors += 1
                log.exception("listener %r of %r failed on %r", callback, topic, item)

    def _add_subscription(self, sub: Subscription) -> None:
        self._running()
        self._subscriptions.setdefault(sub.topic, []).append(sub)

    def _remove_subscription(self, sub: Subscription) -> None:
        subs = self._subscriptions.get(sub.topic, [])
        if sub in subs:
            subs.remove(sub)
        if not subs:
            self._subscriptions.pop(sub.topic, None)

    def _on_events(self, events: list[OutEvent]) -> None:
        """The core's events of one input, in order: messages and losses go to retention,
        then to each subscription of their topic as one batch, and to listeners; queries
        from peers are answered from retention."""
        now = trio.current_time()
        retain = self._retention.add
        fetching = self._fetching
        batches: dict[str, list[Message | Lost]] = {}
        for event in events:
            kind = type(event)
            if kind is Deliver or kind is Published or kind is Recovered:
                envelope = event.envelope  # type: ignore[union-attr]
                message = _message(event.topic, event.id, envelope)  # type: ignore[union-attr]
                retain(_Kept(message, envelope.signature), now)
                if fetching:
                    for waiter in fetching.get((message.topic, message.publisher), ()):
                        if waiter.low <= message.seq <= waiter.high:
                            waiter.arrived.set()
                # History is for retention, and control streams are bookkeeping: neither
                # is news for subscribers.
                if kind is not Recovered and not message.publisher.startswith(CONTROL_PREFIX):
                    batches.setdefault(message.topic, []).append(message)
            elif kind is DataLost:
                lost = Lost(event.publisher, event.first_seq, event.last_seq)  # type: ignore[union-attr]
                batches.setdefault(event.topic, []).append(lost)  # type: ignore[union-attr]
            elif kind is NeighborUp:
                waiting = self._first_neighbor.get(event.topic)  # type: ignore[union-attr]
                if waiting is not None and not waiting[0].is_set():
                    waiting[1].append(event.peer)  # type: ignore[union-attr]
                    waiting[0].set()
                link = (event.topic, event.peer)  # type: ignore[union-attr]
                if link in self._catching_up:
                    self._catching_up[link] = True  # compare again once this one is done
                elif self._nursery is not None:
                    self._catching_up[link] = False
                    self._nursery.start_soon(self._catch_up, *link)
            elif kind is Isolated:
                self._on_isolated(event.topic)  # type: ignore[union-attr]
            elif kind is ViewReport:
                for waiter in self._view_waiters.pop((event.topic, event.peer), ()):  # type: ignore[union-attr]
                    waiter.view = event.view  # type: ignore[union-attr]
                    waiter.arrived.set()
            elif kind is HeldAsked:
                self._answer_held(event)  # type: ignore[arg-type]
            elif kind is HistoryAsked:
                self._serve_history(event)  # type: ignore[arg-type]
            elif kind is HeldReport:
                held_waiter = self._held_waiters.get(event.held.nonce)  # type: ignore[union-attr]
                if held_waiter is not None and held_waiter.peer == event.peer:  # type: ignore[union-attr]
                    held_waiter.held = event.held  # type: ignore[union-attr]
                    held_waiter.arrived.set()
            elif kind is TopicsReport:
                for topics_waiter in self._topics_waiters.pop(event.peer, ()):  # type: ignore[union-attr]
                    topics_waiter.topics = event.topics  # type: ignore[union-attr]
                    topics_waiter.arrived.set()
        for topic, items in batches.items():
            for sub in self._subscriptions.get(topic, ()):
                sub.offer_many(items)
            if topic in self._listeners:
                for item in items:
                    self._tell_listeners(topic, item)

    def _on_isolated(self, topic: str) -> None:
        """The topic has no neighbour left: dial its bootstrap addresses again."""
        addresses = self._bootstrap.get(topic)
        if addresses and topic not in self._refreshing and self._nursery is not None:
            self._refreshing.add(topic)
            self._nursery.start_soon(self._refresh_contacts, topic, addresses)

    def _answer_held(self, event: HeldAsked) -> None:
        held = self._held_page(event.topic, event.query)
        self._running().input(AnswerHeld(event.topic, event.peer, held))

    def _held_page(self, topic: str, query: GetHeld) -> Held:
        """A GETHELD's answer from retention: one page, never more than MAX_HELD_SPANS."""
        now = trio.current_time()
        store = self._retention
        more = False
        found: list[tuple[bytes, Span]] = []
        if query.spans:
            for asked in query.spans:
                span = store.span(topic, asked.publisher, asked.first_seq, asked.last_seq, now)  # type: ignore[arg-type]
                if span is not None:
                    found.append((asked.publisher, span))  # type: ignore[arg-type]
        else:
            offsets = store.offsets(topic, now)
            after = sorted(p for p in offsets if p > query.after)
            more = len(after) > MAX_HELD_SPANS
            found = [(p, offsets[p]) for p in after[:MAX_HELD_SPANS]]
        spans = []
        for publisher, span in found:
            since = span.first
            if query.since_ms:
                first = store.first_since(topic, publisher, query.since_ms, now)
                since = span.last + 1 if first is None or first > span.last else max(first, since)
            spans.append(
                HeldSpan(
                    publisher=publisher,
                    first_seq=span.first,
                    last_seq=span.last,
                    count=span.count,
                    since_seq=since,
                )
            )
        return Held(nonce=query.nonce, spans=tuple(spans), more=more)

    def _serve_history(self, event: HistoryAsked) -> None:
        """A PULL's seqs the core's cache lacked, from retention when it holds them."""
        wanted = set(event.seqs)
        kept = self._retention.get(
            event.topic,
            event.publisher,  # type: ignore[arg-type]
            min(event.seqs),
            max(event.seqs),
            trio.current_time(),
        )
        found = tuple((k.message.id, k.envelope()) for k in kept if k.message.seq in wanted)
        if found:
            self._running().input(ServeHistory(event.topic, event.peer, found))

    async def _catch_up(self, topic: str, peer: bytes) -> None:
        """A link came up: pull from `peer` what it holds of `topic`, published since we
        joined, that this node lacks; again if the link came up again meanwhile.

        Messages are lost with a link: a peer too slow for a burst overflows its send queue
        and the link closes with the queue's messages, IHAVEs included; once the burst has
        ended no later message shows the gap, and no IHAVE comes again. Comparing holdings
        (GETHELD, answered from retention) when the link returns repairs that, whichever end
        lost the messages. After the tree's own repair (gap_timeout), so that live traffic
        in flight is not pulled twice; at most CATCH_UP_AT_ONCE at once, each bounded by
        CATCH_UP_TIMEOUT."""
        link = (topic, peer)
        try:
            while True:
                # One link of a topic at a time: the next finds what this one pulled held,
                # instead of pulling it a second time from another neighbour.
                lock = self._catch_up_locks.setdefault(topic, trio.Lock())
                async with lock, self._catch_up_slots:
                    await self._catch_up_once(topic, peer)
                if not self._catching_up.get(link):
                    return
                self._catching_up[link] = False  # it came up again while we compared
        except LocalProtocolError:
            return  # the node stopped
        finally:
            self._catching_up.pop(link, None)
            if not any(t == topic for t, _ in self._catching_up):
                self._catch_up_locks.pop(topic, None)

    async def _catch_up_once(self, topic: str, peer: bytes) -> None:
        runtime = self._running()
        pause = self._config.broadcast.gap_timeout
        with trio.move_on_after(CATCH_UP_TIMEOUT):
            while True:
                await trio.sleep(pause)  # the tree's own repair first; then between asks
                if peer not in (n.peer_id for n in self.neighbors(topic)):
                    return  # the link went again (its return starts another catch-up)
                joined = self._joined_ms.get(topic)
                if joined is None:
                    return
                since = max(1, joined - CATCH_UP_CLOCK_SLACK_MS)
                spans = await self.held_by(topic, peer, since_ms=since)
                if spans is not None:
                    break  # else no answer: the link may be closing, or the peer busy
        if spans is None:
            return
        self._catch_ups += 1
        with trio.move_on_after(CATCH_UP_TIMEOUT):
            for span in spans:
                if span.publisher != runtime.me:
                    await self._catch_up_stream(topic, peer, span)

    async def _catch_up_stream(self, topic: str, peer: bytes, span: HeldSpan) -> None:
        """Fetch from `peer` the seqs of `span` since our join (its since_seq) that this
        node lacks, when `peer` holds more of them than we do; while the fetches gain."""
        publisher = span.publisher
        if not isinstance(publisher, bytes) or not publisher:
            return
        last = span.last_seq
        first = max(span.since_seq, span.first_seq, last - FETCH_MAX_SPAN + 1)
        if first > last:
            return
        # The peer holds at least this many of first..last (count covers first_seq..last).
        theirs = span.count - (first - span.first_seq)
        while True:
            ours = self._retention.span(topic, publisher, first, last, trio.current_time())
            had = 0 if ours is None else ours.count
            if had >= last - first + 1 or had >= theirs:
                return
            got = len(await self.fetch(topic, publisher, first, last, holders=[peer]))
            self._caught_up += max(0, got - had)
            if got <= had:
                return  # nobody gave more: what is left is not to be had now

    # -- queries ----------------------------------------------------------------------------

    def neighbors(self, topic: str) -> list[Neighbor]:
        """The topic's active view: near links first, then random ones, by peer id."""
        state = self._running().state
        eager = set(state.eager_peers(topic))
        out = []
        for peer, kind in state.active_view(topic).items():
            try:
                address = str(parse_peer_id(peer))
            except PeerIdError:
                address = "?"
            rtt = state.rtt(peer)
            out.append(
                Neighbor(
                    peer_id=peer,  # type: ignore[arg-type]
                    address=address,
                    kind="near" if kind is LinkKind.NEAR else "rand",
                    role="eager" if peer in eager else "lazy",
                    rtt_ms=None if rtt is None else rtt * 1000.0,
                )
            )
        return sorted(out, key=lambda n: (n.kind != "near", n.peer_id))

    def passive_view_size(self, topic: str) -> int:
        """How many peers the topic's passive view holds (0 when not joined)."""
        return len(self._running().state.passive_view(topic))

    async def view_of(
        self, topic: str, peer_id: bytes, *, timeout: float = VIEW_TIMEOUT
    ) -> View | None:
        """`peer_id`'s active view of `topic`, as it answers GETVIEW (any node of the
        deployment, neighbour or not: it is dialled); None when no answer came within
        `timeout` seconds. This node's own view is read here, without a message.
        episub.crawl walks the overlay with it."""
        runtime = self._running()
        if peer_id == runtime.me:
            await trio.lowlevel.checkpoint()
            return runtime.state.view(topic)
        waiter = _ViewWaiter(trio.Event())
        key = (topic, peer_id)
        first = key not in self._view_waiters
        self._view_waiters.setdefault(key, []).append(waiter)
        try:
            if first:
                runtime.input(AskView(topic, peer_id))
            with trio.move_on_after(timeout):
                await waiter.arrived.wait()
        finally:
            waiters = self._view_waiters.get(key)
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._view_waiters[key]
        return waiter.view

    def stats(self) -> dict[str, int]:
        """Core counters (summed over topics), runtime counters, subscriptions, retention."""
        runtime = self._running()
        out = dict(runtime.state.stats())
        out.update(runtime.stats())
        subs = [s for group in self._subscriptions.values() for s in group]
        out["subscriptions"] = len(subs)
        out["subscriber_dropped"] = sum(s.dropped for s in subs)
        out["subscribers_lagged"] = sum(1 for s in subs if s.dropped)
        out["listeners"] = sum(len(group) for group in self._listeners.values())
        out["listener_errors"] = self._listener_errors
        out["catch_ups"] = self._catch_ups  # links whose holdings were compared on coming up
        out["caught_up"] = self._caught_up  # messages those catch-ups pulled
        out["signed"] = int(self._sign)  # signed publishing on (1) or off (0)
        out["retained_messages"] = len(self._retention)
        out["retained_bytes"] = self._retention.bytes
        bounds = self._retention.config  # what this node was started with, for operators
        out["retention_max_messages"] = bounds.max_messages
        out["retention_max_bytes"] = bounds.max_bytes
        out["retention_max_age_s"] = round(bounds.max_age)
        return out

    async def fetch(
        self,
        topic: str,
        publisher: bytes,
        first_seq: int,
        last_seq: int,
        *,
        timeout: float = FETCH_TIMEOUT,
        holders: Iterable[bytes] = (),
    ) -> list[Message]:
        """`retained`, after asking in turn (PULL) `holders` (peer ids of nodes known to
        hold the range, neighbours or not), then the topic's neighbours, for what this node
        lacks of the range: a node that joined late, or restarted, fills its history this
        way (a Spark executor reading a replayed micro-batch). Each answers from its cache
        or its retention. Returns what this node then holds, in order, when the range is
        complete or `timeout` seconds have passed; what nobody asked holds stays absent."""
        runtime = self._running()
        if not 0 <= first_seq <= last_seq:
            raise ValueError(f"need 0 <= first_seq <= last_seq, not {first_seq!r}..{last_seq!r}")
        if last_seq - first_seq >= FETCH_MAX_SPAN:
            raise ValueError(
                f"a fetch spans at most {FETCH_MAX_SPAN} seqs, not {first_seq}..{last_seq}"
            )
        known = [h for h in dict.fromkeys(holders) if h != runtime.me]
        key = (topic, publisher)
        waiters = self._fetching.setdefault(key, [])
        waiter = _FetchWaiter(first_seq, last_seq, trio.Event())
        waiters.append(waiter)
        try:
            with trio.move_on_after(timeout):
                for asked in itertools.count():
                    held = self.retained(topic, publisher, first_seq, last_seq)
                    gap = _missing(held, first_seq, last_seq)
                    if gap is None:
                        break
                    peers = [
                        *known,
                        *(n.peer_id for n in self.neighbors(topic) if n.peer_id not in known),
                    ]
                    if not peers:
                        await trio.sleep(FETCH_RETRY)  # no neighbour yet: one may come
                        continue
                    low, high = gap[0], min(gap[1], gap[0] + FETCH_CHUNK - 1)
                    waiter.low, waiter.high = low, high
                    waiter.arrived = trio.Event()
                    runtime.input(Fetch(topic, peers[asked % len(peers)], publisher, low, high))
                    # Answers come as a burst; once this neighbour is quiet, what is still
                    # missing is asked of the next.
                    with trio.move_on_after(FETCH_RETRY):
                        await waiter.arrived.wait()
                    while waiter.arrived.is_set():
                        waiter.arrived = trio.Event()
                        with trio.move_on_after(FETCH_QUIET):
                            await waiter.arrived.wait()
        finally:
            waiters.remove(waiter)
            if not waiters:
                del self._fetching[key]
        return self.retained(topic, publisher, first_seq, last_seq)

    def retained(
        self, topic: str, publisher: bytes, first_seq: int, last_seq: int
    ) -> list[Message]:
        """Stored messages of `publisher` on `topic`, first_seq..last_seq, in order; what
        was never delivered here, or has aged out of retention, is absent."""
        self._running()
        now = trio.current_time()
        return [k.message for k in self._retention.get(topic, publisher, first_seq, last_seq, now)]

    def held(self, topic: str) -> dict[bytes, Span]:
        """publisher -> what this node holds of it on `topic` (retention's summary): the
        first and last seq held and how many. What `held_by` asks other nodes."""
        self._running()
        return self._retention.offsets(topic, trio.current_time())

    async def held_by(
        self,
        topic: str,
        peer_id: bytes,
        *,
        spans: tuple[HeldSpan, ...] = (),
        since_ms: int = 0,
        timeout: float = HELD_TIMEOUT,
    ) -> list[HeldSpan] | None:
        """What `peer_id` (any node of the deployment, neighbour or not: it is dialled)
        holds of `topic`: within `spans` (at most MAX_HELD_SPANS), or of every publisher
        (page after page); with `since_ms`, each span's first seq stamped at or after it.
        None when an answer did not come within `timeout` seconds (per page). This node's
        own holdings are read here, without a message."""
        runtime = self._running()
        check_topic_name(topic)
        if len(spans) > MAX_HELD_SPANS:
            raise ValueError(f"at most {MAX_HELD_SPANS} spans per ask, not {len(spans)}")
        out: list[HeldSpan] = []
        after = b""
        for _ in range(HELD_MAX_PAGES):
            nonce = next(self._held_nonces)
            query = GetHeld(nonce=nonce, spans=spans, after=after, since_ms=since_ms)
            if peer_id == runtime.me:
                await trio.lowlevel.checkpoint()
                page: Held | None = self._held_page(topic, query)
            else:
                page = await self._ask_held(runtime, topic, peer_id, query, timeout)
            if page is None:
                return None
            out += page.spans
            if not page.more or not page.spans:
                return out
            after = page.spans[-1].publisher  # type: ignore[assignment]
        return out

    async def _ask_held(
        self, runtime: Runtime, topic: str, peer_id: bytes, query: GetHeld, timeout: float
    ) -> Held | None:
        waiter = _HeldWaiter(peer_id, trio.Event())
        self._held_waiters[query.nonce] = waiter
        try:
            runtime.input(AskHeld(topic, peer_id, query))
            with trio.move_on_after(timeout):
                await waiter.arrived.wait()
        finally:
            del self._held_waiters[query.nonce]
        return waiter.held

    async def peer_at(self, address: str) -> bytes:
        """The peer id of the node listening at `address` ("host:port"), connecting to it
        (and proving the key) if need be. OSError or HandshakeError when it cannot."""
        runtime = self._running()
        return await runtime.connect(parse_address(address))

    async def topics_of(self, peer_id: bytes, *, timeout: float = VIEW_TIMEOUT) -> list[str] | None:
        """The topics `peer_id` is in (GETTOPICS; any node, dialled if need be); None when
        no answer came within `timeout` seconds. This node's own are read here."""
        runtime = self._running()
        if peer_id == runtime.me:
            await trio.lowlevel.checkpoint()
            return runtime.state.topics()
        waiter = _TopicsWaiter(trio.Event())
        first = peer_id not in self._topics_waiters
        self._topics_waiters.setdefault(peer_id, []).append(waiter)
        try:
            if first:
                runtime.input(AskTopics(peer_id))
            with trio.move_on_after(timeout):
                await waiter.arrived.wait()
        finally:
            waiters = self._topics_waiters.get(peer_id)
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._topics_waiters[peer_id]
        return None if waiter.topics is None else list(waiter.topics)


@dataclass(slots=True)
class _ViewWaiter:
    arrived: trio.Event
    view: View | None = None


@dataclass(slots=True)
class _HeldWaiter:
    peer: bytes  # the one asked: an answer from anyone else is not this one's
    arrived: trio.Event
    held: Held | None = None


@dataclass(slots=True)
class _TopicsWaiter:
    arrived: trio.Event
    topics: tuple[str, ...] | None = None


class _Kept:
    """What retention keeps of a message: the application's view of it, and its signature
    (signed publishing), so that it can be served to other nodes as it was published."""

    __slots__ = ("message", "signature")

    def __init__(self, message: Message, signature: Signature | None) -> None:
        self.message = message
        self.signature = signature

    # What RetentionStore reads (retention.Storable):
    @property
    def topic(self) -> str:
        return self.message.topic

    @property
    def publisher(self) -> bytes:
        return self.message.publisher

    @property
    def seq(self) -> int:
        return self.message.seq

    @property
    def size(self) -> int:
        return self.message.size

    @property
    def timestamp_ms(self) -> int:
        return self.message.timestamp_ms

    @property
    def id(self) -> bytes:
        return self.message.id

    def envelope(self) -> Envelope:
        m = self.message
        return Envelope(
            publisher=m.publisher,
            seq=m.seq,
            timestamp_ms=m.timestamp_ms,
            payload=m.value,
            key=m.key,
            headers=m.headers,
            signature=self.signature,
        )


@dataclass(slots=True)
class _FetchWaiter:
    low: int  # the seqs asked for now
    high: int
    arrived: trio.Event


def _missing(held: list[Message], first_seq: int, last_seq: int) -> tuple[int, int] | None:
    """The span from the first to the last seq of first..last that `held` lacks."""
    have = {m.seq for m in held}
    lacking = [s for s in range(first_seq, last_seq + 1) if s not in have]
    return (lacking[0], lacking[-1]) if lacking else None


def _message(topic: str, message_id: bytes, envelope: Envelope) -> Message:
    return Message(
        topic=topic,
        publisher=envelope.publisher,  # type: ignore[arg-type]
        seq=envelope.seq,
        timestamp_ms=envelope.timestamp_ms,
        key=envelope.key,
        value=envelope.payload,
        headers=envelope.headers,
        id=message_id,
    )


def _receipts(records: tuple[Record, ...], outputs: list[OutEvent]) -> list[Receipt]:
    """Each record's receipt, from what the core output for the batch: our own stream's
    records in order as `Published`; a named place as `AlreadyPublished` (taken), as the
    `Deliver` of its place (delivered), or neither (held behind an earlier place)."""
    own: list[Published] = []
    placed: dict[tuple[bytes, int], list[Receipt]] = {}
    for out in outputs:
        kind = type(out)
        if kind is Published:
            own.append(out)  # type: ignore[arg-type]
        elif kind is AlreadyPublished:
            place = (out.publisher, out.seq)  # type: ignore[union-attr]
            placed.setdefault(place, []).append(Receipt(out.id, *place, duplicate=True))  # type: ignore[union-attr,arg-type]
        elif kind is Deliver:
            envelope = out.envelope  # type: ignore[union-attr]
            place = (envelope.publisher, envelope.seq)
            placed.setdefault(place, []).append(Receipt(out.id, *place, duplicate=False))  # type: ignore[union-attr,arg-type]
    receipts = []
    mine = iter(own)
    for record in records:
        if record.stream is None:
            published = next(mine, None)
            if published is None:
                raise AssertionError("the core accepted a publish without reporting it")
            envelope = published.envelope
            receipts.append(Receipt(published.id, envelope.publisher, envelope.seq, False))  # type: ignore[arg-type]
            continue
        got = placed.get(record.stream)
        if got:
            receipts.append(got.pop(0))
        else:
            # Held in order behind an earlier place of the stream that has not come yet:
            # accepted, and delivered here once the gap before it is filled or given up.
            receipts.append(Receipt(None, *record.stream, duplicate=False))
    return receipts
