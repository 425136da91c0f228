"""The public async API: one episub node, as a trio async context manager.

    async with Node(key=KEY, listen="127.0.0.1:0") as node:
        await node.join("prices", bootstrap=["10.0.0.5:7000"])
        async with node.subscribe("prices") as sub:
            await node.publish("prices", b"42")
            async for item in sub:
                ...

`Node` checks its arguments (episub.node.checks) and composes the parts behind it, each
with one job, none importing another's state: its lifetime (lifetime), bootstrap racing
(bootstrap), publishing (publishing), fan-out to subscribers and listeners (fanout),
fetch retries (fetching), catch-up of a link that came up (catchup) and asking other
nodes (queries). The core keeps what the node holds (its message store, which also answers
other nodes' GETHELD and PULL); the node reads it through `store`. The core's events of
one input come to `_on_events`, which hands each to its part.

Choices the API makes:
- A node's own publishes reach its own subscribers (and its store) too, as a Kafka
  consumer sees what its own process produced.
- `join` dials every bootstrap address at once; the node's own address is skipped, so
  every node of a deployment can be given the same bootstrap list (episub.node.bootstrap).
- `publish` paces a burst: while a neighbour's send queue is more than half full, it waits
  for the queue to drain (up to `PUBLISH_WAIT`, after which that neighbour is dropped as
  too slow), so a fast publisher neither overflows a live peer's queue nor loses the link.
- A topic left with no neighbour and no passive peer goes back to its bootstrap addresses.
"""

from __future__ import annotations

import secrets
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from functools import partial
from random import Random
from types import TracebackType
from typing import assert_never

import trio

from episub.net.handshake import HANDSHAKE_TIMEOUT, check_key
from episub.net.link_delay import LinkDelay
from episub.net.network import MAX_CONNECTIONS
from episub.net.peer_id import parse_address
from episub.net.runtime import DIAL_TIMEOUT, Runtime
from episub.node import checks
from episub.node.bootstrap import Bootstraps, reach
from episub.node.catchup import CatchUp
from episub.node.fanout import Fanout
from episub.node.fetching import FETCH_TIMEOUT, Fetcher, FetchReport
from episub.node.lifetime import running
from episub.node.publishing import Receipt, Receipts, publish_checked
from episub.node.queries import VIEW_TIMEOUT, Queries, neighbors
from episub.node.retained import delivery_of, retained, retained_envelopes
from episub.proto.config import NodeConfig
from episub.proto.envelope import Envelope, Record
from episub.proto.errors import LocalProtocolError
from episub.proto.events import (
    AlreadyPublished,
    AppEvent,
    DataLost,
    Deliver,
    HeldQueried,
    HeldReport,
    Isolated,
    JoinTopic,
    LeaveTopic,
    NeighborDown,
    NeighborUp,
    Published,
    PublishMany,
    Recovered,
    TopicsReport,
    ViewReport,
    check_publish_batch,
)
from episub.proto.messages import GetHeld, Held, HeldSpan, View, check_topic_name
from episub.proto.reserved import CONTROL_PREFIX
from episub.proto.signing import Signer
from episub.proto.store import MessageStore, RetentionConfig, Span
from episub.records import HELD_TIMEOUT, SUBSCRIPTION_BUFFER, NeighborLink
from episub.subscription import Delivery, Lost, Subscription

__all__ = ["JOIN_TIMEOUT", "Node"]

# join() returns once the topic has a first neighbour, so that a publish right after it
# reaches someone; a JOIN walk plus a NEIGHBOR exchange is a few RTTs.
JOIN_TIMEOUT = 10.0  # guess: = DIAL_TIMEOUT, far above a few loopback or LAN RTTs


class Node:
    """One episub node. Use as `async with Node(key=...) as node:`.

    key: the deployment's shared 32-byte key; peers without it cannot connect.
    listen: "host:port" to listen on; port 0 picks a free port.
    config: protocol parameters (episub.proto.config).
    link_delay: optional f(my_id, peer_id) -> seconds to hold back every frame sent to
        that peer (emulated network delay, for tests and demos; see zones_link_delay).
    retention: bounds of the core's message store, behind `retained()` (`store`).
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
        self._sign = checks.check_sign(sign)
        self._listen = parse_address(listen, allow_port_zero=True)
        self._advertise = checks.advertised_host(listen, self._listen.host, advertise)
        self._config = config if config is not None else NodeConfig()
        self._link_delay = link_delay
        self._retention = retention or RetentionConfig()  # the core's store's bounds
        self._store: MessageStore | None = None  # the core's, once it runs
        self._handshake_timeout = handshake_timeout
        self._dial_timeout = dial_timeout
        self._encrypt = encrypt
        self._max_connections = max_connections
        self._seed = seed if seed is not None else secrets.randbits(64)
        self._runtime: Runtime | None = None
        self._address = ""
        self._nursery: trio.Nursery | None = None
        self._lifetime_cm: AbstractAsyncContextManager[Node] | None = None
        # The parts, each owning its own state (see the module docstring).
        self._bootstraps = Bootstraps()
        self._fanout = Fanout()
        self._fetcher = Fetcher()
        self._queries = Queries()
        self._catch_up = CatchUp(self, self._config.broadcast.gap_timeout)
        # The receipts of the publish being fed to the core, collected from its events.
        self._receipts: Receipts | None = None
        # topic -> the event its next link change sets (`link_change`): made when asked
        # for, set and let go at the change, so at most one a topic.
        self._link_changes: dict[str, trio.Event] = {}

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
        async with running(
            listen=self._listen,
            advertise=self._advertise,
            sign=self._sign,
            make_runtime=self._make_runtime,
            on_stop=self._stopped,
        ) as (runtime, nursery, address):
            self._runtime, self._nursery, self._address = runtime, nursery, address
            yield self

    def _make_runtime(self, my_id: bytes, signer: Signer | None) -> Runtime:
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
            retention=self._retention,
        )
        self._store = runtime.state.store
        return runtime

    def _stopped(self) -> None:
        self._fanout.close()
        self._runtime = None
        self._nursery = None

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

    @property
    def store(self) -> MessageStore:
        """The core's message store (episub.proto.store): what this node holds of each
        topic's streams, read with `store_now()`'s time. Prefer `retained`, `held` and
        `held_seqs`; this is for the node's own parts and tools."""
        return self._running().state.store

    def store_now(self) -> float:
        """Now on the core's clock: the `now` the store's queries take."""
        return self._running().now()

    # -- topics -----------------------------------------------------------------------------

    async def join(
        self,
        topic: str,
        bootstrap: Iterable[str] = (),
        *,
        timeout: float = JOIN_TIMEOUT,
        retain: bool = True,
        history: bool = True,
    ) -> None:
        """Join `topic` through any of the `bootstrap` addresses ("host:port").

        `history=False`: catch-ups pull only what is published from the join on, not what
        the neighbours retained from before it (see episub/node/catchup.py): for a node
        whose readers fetch the ranges they read (the Spark source's), which would
        otherwise copy every neighbour's retention in the background as they read.

        `retain=False`: the topic's messages are delivered but offered as no history, so
        `retained` and `fetch` find none of them and a new link starts no comparison of
        holdings from this end (for state that catches up otherwise, as episub.config's
        snapshots do).

        An empty list (or one naming only this node) starts the topic's overlay here.
        Otherwise this returns once the topic has its first neighbour, so that a publish
        right after it reaches the overlay. Raises BootstrapError, with every address's
        failure, when none answers; TimeoutError when no neighbour came within `timeout`
        seconds (the node stays joined and keeps trying).
        """
        runtime = self._running()
        check_topic_name(topic)
        checks.check_bootstrap(bootstrap)
        if topic in runtime.state.topics():
            raise LocalProtocolError(f"already joined topic {topic!r}")
        own = parse_address(self._address)
        addresses = list(dict.fromkeys(a for a in map(parse_address, bootstrap) if a != own))
        contacts: list[bytes] = []
        if addresses:
            contacts = await reach(runtime, addresses)
        else:
            await trio.lowlevel.checkpoint()
        up, who = self._bootstraps.joining(topic)
        self._catch_up.joined(topic, history)
        runtime.input(JoinTopic(topic, tuple(dict.fromkeys(contacts)), retain))
        self._bootstraps.joined(topic, addresses)
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

    async def leave(self, topic: str) -> None:
        """Leave `topic`: neighbours are told (LEAVE); subscriptions stay open."""
        runtime = self._running()
        await trio.lowlevel.checkpoint()
        runtime.input(LeaveTopic(topic))
        self._bootstraps.left(topic)
        self._catch_up.left(topic)

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
        checked = checks.as_records(records)
        if not checked:
            return []
        await trio.lowlevel.checkpoint()
        limit = self._config.broadcast.max_message_size
        check_publish_batch(checked, runtime.me, limit, topic)  # all or none, before a chunk
        return await publish_checked(runtime, checked, partial(self._publish_chunk, topic))

    def _publish_chunk(self, topic: str, records: tuple[Record, ...]) -> list[Receipt]:
        receipts = self._receipts = Receipts(records)
        try:
            self._running().input(PublishMany(topic, records))
        finally:
            self._receipts = None
        return receipts.of_records()

    def subscribe(self, topic: str, buffer: int = SUBSCRIPTION_BUFFER) -> Subscription:
        """Items of `topic` (Delivery, Lagged, Lost) from entering `async with` on.

        The topic need not be joined yet: items flow while it is.
        """
        self._running()
        return Subscription(topic, buffer, self._add_subscription, self._fanout.remove)

    def _add_subscription(self, sub: Subscription) -> None:
        self._running()
        self._fanout.add(sub)

    @contextmanager
    def deliver_to(self, topic: str, callback: Callable[[Delivery | Lost], None]) -> Iterator[None]:
        """Call `callback(item)` for each item of `topic` (Delivery, Lost) while in the block.

        For in-process components that keep state, such as a configuration replica: the
        call happens as the node delivers the message, inside its event processing, so it
        costs no task switch and no buffer (nothing lags), but it must be quick and must
        not block. An exception it raises is logged and counted (`listener_errors`), and
        the node carries on. Applications use `subscribe`.
        """
        self._running()
        with self._fanout.listen(topic, callback):
            yield

    def listen(
        self, topic: str, callback: Callable[[Delivery | Lost], None]
    ) -> AbstractContextManager[None]:
        """Deprecated name of `deliver_to` (it clashed with the `listen=` address)."""
        warnings.warn(
            "Node.listen(topic, callback) is deprecated: use Node.deliver_to(topic, callback)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.deliver_to(topic, callback)

    def _on_events(self, events: list[AppEvent]) -> None:
        """The core's events of one input, in order (the core has stored their messages),
        each to its part: messages and losses to each subscription of their topic as one
        batch, and to listeners; receipts to the publish being fed; reports to the queries
        waiting."""
        fetching = self._fetcher.waiting
        subscriptions = self._fanout.subscriptions
        listeners = self._fanout.listeners
        receipts = self._receipts
        batches: dict[str, list[Delivery | Lost]] = {}
        batch_topic: str | None = None  # the topic whose batch is at hand: runs of one topic
        batch: list[Delivery | Lost] = []
        for event in events:
            match event:
                case Deliver() | Published() | Recovered():  # per message: kept inline
                    topic, mid, envelope = event.topic, event.id, event.envelope
                    publisher: bytes = envelope.publisher  # the runtime's peer ids are bytes
                    seq = envelope.seq
                    if fetching:
                        self._fetcher.arrived(topic, publisher, seq)
                    if receipts is not None:
                        receipts.note(event)
                    # History is for the store, and control streams are bookkeeping: neither
                    # is news for subscribers. A message (a copy of the payload) is made only
                    # for a topic someone subscribes or listens to.
                    if (
                        type(event) is not Recovered
                        and (topic in subscriptions or topic in listeners)
                        and not publisher.startswith(CONTROL_PREFIX)
                    ):
                        if topic != batch_topic:
                            batch = batches.setdefault(topic, [])
                            batch_topic = topic
                        batch.append(delivery_of(topic, mid, envelope))
                case AlreadyPublished():
                    if receipts is not None:
                        receipts.note(event)
                case DataLost():
                    lost = Lost(event.publisher, event.first_seq, event.last_seq)
                    batches.setdefault(event.topic, []).append(lost)
                case NeighborUp(topic=topic, peer=peer):
                    self._bootstraps.neighbor_up(topic, peer)
                    self._catch_up.link_up(topic, peer, self._nursery)
                    self._links_changed(topic)
                case Isolated(topic=topic):
                    self._bootstraps.isolated(topic, self._running, self._nursery)
                case ViewReport():
                    self._queries.on_view(event)
                case HeldReport():
                    self._queries.on_held(event)
                case TopicsReport():
                    self._queries.on_topics(event)
                case HeldQueried(topic=topic, peer=peer):
                    self._catch_up.asked(topic, peer, self._nursery)
                case NeighborDown(topic=topic):
                    self._links_changed(topic)  # the core re-links on its own
                case _:
                    assert_never(event)
        if batches:
            self._fanout.deliver(batches)

    # -- queries ----------------------------------------------------------------------------

    def neighbors(self, topic: str) -> list[NeighborLink]:
        """The topic's active view: near links first, then random ones, by peer id."""
        return neighbors(self._running().state, topic)

    def link_change(self, topic: str) -> trio.Event:
        """An event set when a neighbour of `topic` next comes or goes. Take it, then read
        `neighbors`: a change after the read sets it, so a watcher misses none and wakes
        only for changes (no polling)."""
        event = self._link_changes.get(topic)
        if event is None:
            event = self._link_changes[topic] = trio.Event()
        return event

    def _links_changed(self, topic: str) -> None:
        event = self._link_changes.pop(topic, None)
        if event is not None:
            event.set()

    def contacts(self, topic: str) -> list[bytes]:
        """The ids of the nodes `topic` was joined through (those of its bootstrap
        addresses that answered), neighbours or not."""
        return self._running().state.contacts(topic)  # type: ignore[return-value]

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
        return await self._queries.view_of(self._running(), topic, peer_id, timeout)

    def stats(self) -> dict[str, int]:
        """Core counters (summed over topics), runtime counters, subscriptions, retention."""
        runtime = self._running()
        out = dict(runtime.state.stats())
        out.update(runtime.stats())
        out.update(self._fanout.stats())
        out.update(self._catch_up.stats())
        out["signed"] = int(self._sign)  # signed publishing on (1) or off (0)
        store = runtime.state.store
        out["retained_messages"] = len(store)
        out["retained_bytes"] = store.bytes
        bounds = store.config  # what this node was started with, for operators
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
    ) -> list[Delivery]:
        """`retained`, after `fetch_range` asked `holders` (peer ids of nodes known to hold
        the range, neighbours or not) and the topic's neighbours for what this node lacks of
        it: a node that joined late, or restarted, fills its history this way. Returns what
        this node then holds, in order; what no node asked holds stays absent."""
        await self.fetch_range(
            topic, publisher, first_seq, last_seq, timeout=timeout, holders=holders
        )
        return self.retained(topic, publisher, first_seq, last_seq)

    async def fetch_range(
        self,
        topic: str,
        publisher: bytes,
        first_seq: int,
        last_seq: int,
        *,
        timeout: float = FETCH_TIMEOUT,
        holders: Iterable[bytes] = (),
        on_progress: Callable[[], None] | None = None,
    ) -> FetchReport:
        """Fetch into retention what this node lacks of first_seq..last_seq from the nodes
        that hold it (episub/node/fetching.py): `timeout` bounds a pause with nothing
        arriving; `on_progress` is called when seqs of it arrive. Says whom it asked and
        what they answered, and what is still lacking."""
        runtime = self._running()
        checks.check_fetch_range(first_seq, last_seq)
        return await self._fetcher.fetch(
            runtime,
            topic,
            publisher,
            first_seq,
            last_seq,
            timeout,
            holders,
            held_seqs=lambda: self.held_seqs(topic, publisher, first_seq, last_seq),
            neighbors=lambda: [n.peer_id for n in self.neighbors(topic)],
            held_by=lambda peer, span, wait: self.held_by(topic, peer, spans=(span,), timeout=wait),
            on_progress=on_progress,
        )

    def held_seqs(self, topic: str, publisher: bytes, first_seq: int, last_seq: int) -> list[int]:
        """The seqs of first_seq..last_seq this node holds of `publisher` on `topic`, in
        order (what `retained` would return, without reading the messages)."""
        runtime = self._running()
        return runtime.state.store.seqs(topic, publisher, first_seq, last_seq, runtime.now())

    def retained(
        self, topic: str, publisher: bytes, first_seq: int, last_seq: int
    ) -> list[Delivery]:
        """Stored messages of `publisher` on `topic`, first_seq..last_seq, in order; what
        never reached this node, or has aged out of its store, is absent (and so is every
        message of a topic joined with `retain=False`, as configuration topics are)."""
        runtime = self._running()
        now = runtime.now()
        return retained(runtime.state.store, topic, publisher, first_seq, last_seq, now)

    def retained_envelopes(
        self, topic: str, publisher: bytes, first_seq: int, last_seq: int
    ) -> list[Envelope]:
        """`retained`'s messages as envelopes (no Delivery made for each): what a reader
        that turns them into columns wants."""
        runtime = self._running()
        now = runtime.now()
        store = runtime.state.store
        return retained_envelopes(store, topic, publisher, first_seq, last_seq, now)

    @property
    def retention_released(self) -> int:
        """Bytes of messages retention has let go (evicted, expired or replaced) since the
        node was made: what tells a node process to give memory back (episub/allocator.py)."""
        return 0 if self._store is None else self._store.released

    def upkeep_deadline(self, delay: float) -> float:
        """When (trio's clock) to wake, at least `delay` seconds from now, for periodic
        work of the node's process: on the node's own slow upkeep ticks, so that the
        process wakes once for both (Runtime.upkeep_deadline)."""
        return self._running().upkeep_deadline(delay)

    def shrink_retention(self) -> None:
        """Give retention's tables the size of what they hold (MessageStore.shrink): for
        a quiet node process, before it gives free memory back (episub/allocator.py)."""
        if self._store is not None:
            self._store.shrink()

    def held(self, topic: str) -> dict[bytes, Span]:
        """publisher -> what this node holds of it on `topic` (retention's summary): the
        first and last seq held and how many. What `held_by` asks other nodes."""
        runtime = self._running()
        return runtime.state.store.offsets(topic, runtime.now())

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
        return await self._queries.held_by(
            runtime, topic, peer_id, spans, since_ms, timeout, self._own_held_page
        )

    def _own_held_page(self, topic: str, query: GetHeld) -> Held:
        runtime = self._running()
        return runtime.state.store.held_page(topic, query, runtime.now())

    async def peer_at(self, address: str) -> bytes:
        """The peer id of the node listening at `address` ("host:port"), connecting to it
        (and proving the key) if need be. OSError or HandshakeError when it cannot."""
        runtime = self._running()
        return await runtime.connect(parse_address(address))

    async def topics_of(self, peer_id: bytes, *, timeout: float = VIEW_TIMEOUT) -> list[str] | None:
        """The topics `peer_id` is in (GETTOPICS; any node, dialled if need be); None when
        no answer came within `timeout` seconds. This node's own are read here."""
        return await self._queries.topics_of(self._running(), peer_id, timeout)
