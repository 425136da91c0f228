"""A blocking client of the agent, for Spark's Python workers and the `episub` command.

    with AgentClient("/tmp/episub/agent.sock") as agent:
        agent.join("prices")
        with agent.subscribe("prices") as sub:
            agent.publish("prices", b"42")
            for item in sub:  # Delivery, Lagged or Lost
                ...

Plain blocking sockets: workers run no event loop, and a worker may be forked or killed at
any time, so nothing here starts a thread. One connection carries every request of the
client, a subscription's items included; while a call waits for its reply, items that
arrive for a subscription are held for it, at most its `buffer` of them: more are dropped
and counted, and the subscription yields `Lagged(count)` where they went missing (as the
agent does for a subscriber that falls behind). Not thread-safe: one client per thread.

Errors (episub/agent/errors.py): `AgentUnavailable` (no agent at the path, connection lost,
no answer within the timeout; the connection is closed then) and `AgentError`, a subclass
per cause the agent gave for refusing a request (the connection stays usable).
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

from episub.agent import agent_pb2 as pb
from episub.agent.errors import (
    AgentError,
    AgentInternalError,
    AgentTimeout,
    AgentTooLarge,
    AgentUnavailable,
    agent_error,
)
from episub.agent.wire import (
    MAX_BATCH_RECORDS,
    MAX_REQUEST_SIZE,
    MAX_RESPONSE_SIZE,
    READ_FETCH_BUDGET,
    FrameError,
    FrameSplitter,
    Record,
    RowsPage,
    checked_record_to_pb,
    decode_response,
    delivery_from_pb,
    encode_frame,
    item_from_pb,
    neighbor_from_pb,
    record_to_pb,
    rows_from_pb,
    span_from_pb,
    span_to_pb,
)
from episub.config.codec import entry_for, value_of
from episub.config.state import Entry
from episub.proto.messages import HeldSpan
from episub.proto.store import Span
from episub.recordbatch import BATCH_HEADER, BatchFormatError
from episub.recordbatch import MAX_ROWS as MAX_BATCH_ROWS
from episub.recordbatch import encode as encode_batch
from episub.records import (
    CRAWL_TIMEOUT,
    HELD_TIMEOUT,
    SUBSCRIPTION_BUFFER,
    Delivery,
    Item,
    LagBuffer,
    Lagged,
    NeighborLink,
    Receipt,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "AgentClient",
    "AgentStatus",
    "AgentSubscription",
    "ConfigView",
    "NodeHoldings",
    "OverlayNode",
]

# Longest wait for one reply. Guess: a join may spend the node's 10 s DIAL_TIMEOUT on a
# bootstrap address that does not answer; this leaves room for a loaded machine on top.
DEFAULT_TIMEOUT = 30.0
RECEIVE_CHUNK = 1 << 20  # bytes read at a time, as the server (record batches: ~1 MiB)
# Room for the Request envelope around a batch's records (topic, field tags, lengths).
_BATCH_OVERHEAD = 1024


@dataclass(frozen=True, slots=True)
class ConfigView:
    """A configuration as one replica held it: its version (every write up to it held) and
    live values, and the highest version it knew exists (above `version` while behind)."""

    name: str
    version: int
    values: dict[str, object]
    stamps: dict[str, tuple[int, bytes]]  # key -> (version, writer) that set it
    known_version: int = 0

    @property
    def lag(self) -> int:
        """Versions the replica knew of but did not hold yet (0: caught up)."""
        return max(0, self.known_version - self.version)

    @property
    def behind(self) -> bool:
        return self.lag > 0


def config_view_from_pb(body: pb.ConfigSnapshot) -> ConfigView:
    values, stamps = {}, {}
    for e in body.entries:
        values[e.key] = value_of(Entry(e.version, e.writer, e.kind, e.data))  # type: ignore[arg-type]
        stamps[e.key] = (e.version, e.writer)
    return ConfigView(body.name, body.version, values, stamps, body.known_version)


@dataclass(frozen=True, slots=True)
class AgentStatus:
    """What `inspect()` reports: the node, its topics' active views, and its counters."""

    node_id: bytes
    address: str
    pid: int  # the agent's process
    topics: dict[str, list[NeighborLink]]
    stats: dict[str, int]
    metrics_url: str = ""  # where it serves Prometheus metrics; "" if it does not


@dataclass(frozen=True, slots=True)
class NodeHoldings:
    """What one node asked by `holdings()` holds of a topic."""

    node_id: bytes  # b"" for an address that could not be reached
    address: str
    answered: bool  # False: unreachable, or no answer in time (spans is then empty)
    spans: list[HeldSpan]


@dataclass(frozen=True, slots=True)
class OverlayNode:
    """One node an `overlay()` walk reached, with its view of the topic."""

    node_id: bytes
    address: str
    answered: bool  # False: it did not answer in time (no neighbours known)
    passive_count: int
    neighbors: list[NeighborLink]


class AgentClient:
    """One connection to the agent at `socket_path`; `timeout` bounds each reply's wait."""

    def __init__(self, socket_path: str, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, not {timeout!r}")
        self.socket_path = socket_path
        self.timeout = timeout
        self._decoder = FrameSplitter(MAX_RESPONSE_SIZE)
        self._ids = itertools.count(1)
        self._subscriptions: dict[int, AgentSubscription] = {}
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(timeout)
            self._sock.connect(socket_path)
        except OSError as exc:
            self._sock.close()
            self._sock = None
            reason = exc.strerror or type(exc).__name__
            raise AgentUnavailable(f"no agent answers at {socket_path!r}: {reason}") from None

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for sub in self._subscriptions.values():
            sub._ended = "the client was closed"
        self._subscriptions.clear()

    @property
    def closed(self) -> bool:
        return self._sock is None

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- requests ---------------------------------------------------------------------------

    def join(
        self,
        topic: str,
        bootstrap: Iterable[str] = (),
        timeout: float = 0.0,
        *,
        history: bool = True,
    ) -> None:
        """Join `topic` (a no-op when joined); no bootstrap: the agent's own list.
        AgentWaitExpired when no neighbour came within `timeout` seconds (0: the node's
        default, 10 s); the node stays joined and keeps trying. `history=False`: the node
        pulls none of what its neighbours retained from before the join (Node.join)."""
        if isinstance(bootstrap, str):
            raise TypeError(f"bootstrap must be a list of 'host:port' strings, not {bootstrap!r}")
        body = pb.Join(topic=topic, bootstrap=list(bootstrap), timeout=timeout)
        body.no_history = not history
        self._call(join=body)

    def leave(self, topic: str) -> None:
        self._call(leave=pb.Leave(topic=topic))

    def publish(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] | None = None,
        *,
        stream: tuple[bytes, int] | None = None,
        timestamp_ms: int | None = None,
    ) -> Receipt:
        """Publish one record; `stream` names its place, `timestamp_ms` its stamp (see
        Node.publish_record)."""
        record = record_to_pb(value, key, headers, stream, timestamp_ms)
        reply = self._call(publish=pb.Publish(topic=topic, record=record)).published
        return _receipts(reply)[0]

    def publish_batch(self, topic: str, records: Iterable[Record | bytes]) -> list[Receipt]:
        """Publish `records` in order, in as few requests as the bounds allow. Each request
        is all or none; if one fails, AgentError.published lists what went before it."""
        out: list[Receipt] = []
        chunk: list[pb.Record] = []
        size = 0
        for record in records:
            if isinstance(record, Record):
                encoded = checked_record_to_pb(record)
            else:
                encoded = record_to_pb(record)
            record_size = encoded.ByteSize() + 8  # its tag and length
            if record_size > MAX_REQUEST_SIZE - _BATCH_OVERHEAD:
                raise AgentTooLarge(
                    f"a record of {record_size} bytes does not fit one agent request "
                    f"({MAX_REQUEST_SIZE - _BATCH_OVERHEAD} bytes at most, a fixed bound of "
                    "the agent protocol that no option raises); publish it through an "
                    "episub.Node of your own, whose bound is max_message_size",
                    out,
                )
            if chunk and (
                len(chunk) >= MAX_BATCH_RECORDS
                or size + record_size > MAX_REQUEST_SIZE - _BATCH_OVERHEAD
            ):
                out += self._publish_chunk(topic, chunk, out)
                chunk, size = [], 0
            chunk.append(encoded)
            size += record_size
        if chunk:
            out += self._publish_chunk(topic, chunk, out)
        return out

    def publish_rows(
        self,
        topic: str,
        stream: bytes,
        rows: Sequence[tuple[int, bytes | None, bytes, Sequence[tuple[str, bytes]]]],
        *,
        place: int = 0,
        first_row: int = 0,
        batch_rows: int = 4096,
    ) -> tuple[int, int]:
        """Publish `rows` ((timestamp_ms, key, value, headers) each) as record batches of
        `batch_rows` at places place, place+1, ... of the named `stream`, numbered from
        `first_row` (episub/recordbatch.py): many rows per overlay message, each keeping its
        own offset. Returns the next place and the next row; a place taken already
        publishes nothing (so a retry with the same arguments publishes each row once)."""
        if not 1 <= batch_rows <= MAX_BATCH_ROWS:
            raise ValueError(f"batch_rows must be in 1..{MAX_BATCH_ROWS}, not {batch_rows!r}")
        records: list[Record] = []
        for low in range(0, len(rows), batch_rows):
            part = rows[low : low + batch_rows]
            records.append(
                Record(
                    value=encode_batch(first_row + low, part),
                    headers=((BATCH_HEADER, b"1"),),
                    stream=(stream, place + len(records)),
                    timestamp_ms=part[0][0],
                )
            )
        self.publish_batch(topic, records)
        return place + len(records), first_row + len(rows)

    def _publish_chunk(
        self, topic: str, chunk: list[pb.Record], before: list[Receipt]
    ) -> list[Receipt]:
        try:
            reply = self._call(publish_batch=pb.PublishBatch(topic=topic, records=chunk))
        except AgentError as exc:
            exc.published = list(before)
            raise
        return _receipts(reply.published)

    def subscribe(self, topic: str, buffer: int = SUBSCRIPTION_BUFFER) -> AgentSubscription:
        """Items of `topic` from now on (the agent has subscribed when this returns)."""
        if not isinstance(buffer, int) or isinstance(buffer, bool) or buffer < 1:
            raise ValueError(f"buffer must be an int >= 1, not {buffer!r}")
        rid = next(self._ids)
        sub = AgentSubscription(self, rid, topic, buffer)
        self._subscriptions[rid] = sub  # before sending: items may follow the reply at once
        try:
            self._call(subscribe=pb.Subscribe(topic=topic, buffer=buffer), rid=rid)
        except BaseException:
            self._subscriptions.pop(rid, None)
            raise
        return sub

    def read_range(
        self,
        topic: str,
        publisher: bytes,
        first_seq: int,
        last_seq: int,
        *,
        fetch_timeout: float = 0.0,
        holders: Iterable[bytes] = (),
        value_prefix: int = 0,
    ) -> list[Delivery]:
        """Retained messages of `publisher`, first_seq..last_seq, in order (what the agent
        no longer holds is absent). Large ranges come in several replies. fetch_timeout > 0:
        the agent's node first asks `holders` (node ids known to hold the range) and its
        neighbours for what it lacks (per reply page); the client's own timeout must leave
        room for that. value_prefix > 0: each value cut to its first that many bytes (a
        record batch's header, see episub.recordbatch)."""
        out: list[Delivery] = []
        range_pages = self._range_pages(
            topic, publisher, first_seq, last_seq, fetch_timeout, holders, value_prefix=value_prefix
        )
        for page in range_pages:
            out += (delivery_from_pb(m) for m in page.messages)
        return out

    def _range_pages(
        self,
        topic: str,
        publisher: bytes,
        first_seq: int,
        last_seq: int,
        fetch_timeout: float,
        holders: Iterable[bytes],
        *,
        value_prefix: int = 0,
        as_rows: bool = False,
    ) -> Iterator[pb.Messages]:
        """The agent's ReadRange pages of first_seq..last_seq, one asked at a time."""
        if not 0 <= first_seq <= last_seq:
            raise ValueError(f"need 0 <= first_seq <= last_seq, not {first_seq!r}..{last_seq!r}")
        seq = first_seq
        holders = list(holders)
        # The agent answers within fetch_timeout of a pause, or READ_FETCH_BUDGET of
        # progress (then with part of the page), plus its own work.
        wait = fetch_timeout + READ_FETCH_BUDGET if fetch_timeout > 0 else 0.0
        while seq <= last_seq:
            body = pb.ReadRange(
                topic=topic,
                publisher=publisher,
                first_seq=seq,
                last_seq=last_seq,
                fetch_timeout=fetch_timeout,
                holders=holders,
                value_prefix=value_prefix,
                as_rows=as_rows,
            )
            page = self._call(wait=wait, read_range=body).messages
            if page.next_seq <= seq:
                raise AgentInternalError(f"read_range made no progress at seq {seq}")
            seq = page.next_seq
            yield page

    def read_range_rows(
        self,
        topic: str,
        publisher: bytes,
        first_seq: int,
        last_seq: int,
        *,
        fetch_timeout: float = 0.0,
        holders: Iterable[bytes] = (),
    ) -> Iterator[RowsPage]:
        """`read_range`'s pages as they come, each page's plain messages as columns (one
        record batch, see episub.recordbatch, and their seqs) rather than one Delivery each:
        what a reader that turns rows into Arrow wants (the Spark source), without a Python
        object per row on either end. A page's record-batch messages come as they are.
        Ask for the next page only after this one was used: the connection is the
        client's, and one page is asked at a time."""
        range_pages = self._range_pages(
            topic, publisher, first_seq, last_seq, fetch_timeout, holders, as_rows=True
        )
        for page in range_pages:
            try:
                rows = rows_from_pb(page)
            except BatchFormatError as exc:
                self.close()  # an agent that sends this is not one to go on with
                raise AgentUnavailable(f"the agent sent a malformed page: {exc}") from None
            yield rows

    def offsets(self, topic: str) -> dict[bytes, Span]:
        """publisher -> what the agent's node holds of it on `topic` (first and last seq
        held, and how many), for every publisher it holds."""
        reply = self._call(offsets=pb.GetOffsets(topic=topic)).offsets
        return {
            p.publisher: Span(p.first_retained_seq, p.last_seq, p.count) for p in reply.publishers
        }

    def holdings(
        self,
        topic: str,
        *,
        spans: Iterable[HeldSpan] = (),
        neighbors: bool = False,
        peers: Iterable[bytes] = (),
        addresses: Iterable[str] = (),
        since_ms: int = 0,
        timeout: float = HELD_TIMEOUT,
    ) -> list[NodeHoldings]:
        """What the agent's node, its neighbours in `topic` (with `neighbors`) and the nodes
        named by id (`peers`) or "host:port" (`addresses`) hold of `topic`: within `spans`,
        or of every publisher; each node gets `timeout` seconds. The agent's node first."""
        body = pb.Holdings(
            topic=topic,
            neighbors=neighbors,
            peers=list(peers),
            addresses=list(addresses),
            since_ms=since_ms,
            timeout=timeout,
        )
        for span in spans:
            span_to_pb(span, body.spans.add())
        # The agent dials unknown addresses first, then asks every node: two timeouts.
        reply = self._call(wait=2 * timeout, holdings=body).holdings_map
        return [
            NodeHoldings(
                node_id=n.node_id,
                address=n.address,
                answered=n.answered,
                spans=[span_from_pb(s) for s in n.spans],
            )
            for n in reply.nodes
        ]

    def known_topics(
        self, *, neighbors: bool = True, addresses: Iterable[str] = (), timeout: float = 0.0
    ) -> list[str]:
        """Topic names the agent's node, its neighbours and the nodes at `addresses` are
        in, sorted."""
        body = pb.KnownTopics(neighbors=neighbors, addresses=list(addresses), timeout=timeout)
        wait = 2 * (timeout or HELD_TIMEOUT)
        return list(self._call(wait=wait, known_topics=body).topic_list.topics)

    def config_read(self, name: str, min_version: int = 0, timeout: float = 0.0) -> ConfigView:
        """Configuration `name` as the agent's replica holds it (started and caught up on
        first use). min_version > 0: wait up to `timeout` s for that version, else raise
        AgentWaitExpired."""
        reply = self._call(
            wait=timeout,
            config_read=pb.ConfigRead(name=name, min_version=min_version, timeout=timeout),
        )
        return config_view_from_pb(reply.config)

    def config_write(
        self, name: str, values: Mapping[str, object] | None = None, delete: Iterable[str] = ()
    ) -> ConfigView:
        """One write to configuration `name`: `values` (bytes, or anything JSON can hold)
        set, `delete` keys removed, all under one new version; returns the view after it.
        AgentTooLarge past the configuration's bounds, nothing written."""
        body = pb.ConfigWrite(name=name, delete=list(delete))
        for key, value in (values or {}).items():
            entry = entry_for(value, 1, b"-")  # checks the value; the agent stamps it
            body.set.add(key=key, kind=entry.kind, data=entry.data)
        return config_view_from_pb(self._call(config_write=body).config)

    def inspect(self) -> AgentStatus:
        info = self._call(inspect=pb.Inspect()).node_info
        return AgentStatus(
            node_id=info.node_id,
            address=info.address,
            pid=info.pid,
            topics={t.topic: [neighbor_from_pb(n) for n in t.neighbors] for t in info.topics},
            stats=dict(sorted(info.stats.items())),
            metrics_url=info.metrics_url,
        )

    def overlay(self, topic: str, max_nodes: int = 0, timeout: float = 0.0) -> list[OverlayNode]:
        """Walk `topic`'s overlay from the agent's node: every node reached, with its
        active view (episub.crawl); the agent's node first. 0: the agent's defaults."""
        body = pb.Overlay(topic=topic, max_nodes=max_nodes, timeout=timeout)
        reply = self._call(wait=timeout or CRAWL_TIMEOUT, overlay=body).overlay_map
        return [
            OverlayNode(
                node_id=n.node_id,
                address=n.address,
                answered=n.answered,
                passive_count=n.passive_count,
                neighbors=[neighbor_from_pb(x) for x in n.neighbors],
            )
            for n in reply.nodes
        ]

    # -- plumbing ---------------------------------------------------------------------------

    def _call(self, rid: int | None = None, *, wait: float = 0.0, **body: object) -> pb.Response:
        """One request and its reply; `wait`: seconds the agent may take on purpose (a
        ConfigRead waiting for a version), on top of the client's timeout."""
        if rid is None:
            rid = next(self._ids)
        self._send(pb.Request(id=rid, **body))  # type: ignore[arg-type]
        deadline = None if self.timeout is None else time.monotonic() + self.timeout + wait
        while True:
            try:
                response = self._receive(deadline)
            except TimeoutError:
                self.close()  # its reply may still come: the stream is no use any more
                raise AgentTimeout(
                    f"no answer from the agent at {self.socket_path!r} within {self.timeout} s"
                ) from None
            if response.id == rid:
                if response.WhichOneof("body") == "error":
                    raise agent_error(response.error.kind, response.error.message)
                return response
            self._route(response)

    def _send(self, request: pb.Request) -> None:
        sock = self._connected()
        try:
            sock.settimeout(self.timeout)
            sock.sendall(encode_frame(request))
        except OSError as exc:
            refusal = self._refusal()
            self.close()
            if refusal is not None:
                raise refusal from None
            raise AgentUnavailable(f"lost the agent at {self.socket_path!r}: {exc}") from None

    def _refusal(self) -> AgentError | None:
        """The agent's reason for closing the connection (too many clients), if it sent
        one before closing: the frame is still readable after our send failed."""
        sock = self._connected()
        try:
            sock.settimeout(0)  # only what has arrived already
            while data := sock.recv(RECEIVE_CHUNK):
                self._decoder.feed(data)
        except OSError:
            pass  # nothing more to read
        try:
            while (body := self._decoder.next_body()) is not None:
                response = decode_response(body)
                if response.id == 0 and response.WhichOneof("body") == "error":
                    return agent_error(response.error.kind, response.error.message)
        except FrameError:
            pass  # a broken frame says nothing: the send's error stands
        return None

    def _connected(self) -> socket.socket:
        if self._sock is None:
            raise AgentUnavailable(f"the connection to the agent at {self.socket_path!r} is closed")
        return self._sock

    def _receive(self, deadline: float | None) -> pb.Response:
        """The next response; TimeoutError past `deadline` (time.monotonic())."""
        while True:
            try:
                body = self._decoder.next_body()
                if body is not None:
                    return decode_response(body)
            except FrameError as exc:
                self.close()
                raise AgentUnavailable(f"the agent sent a malformed frame: {exc}") from None
            sock = self._connected()
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
            else:
                sock.settimeout(None)
            try:
                data = sock.recv(RECEIVE_CHUNK)
            except TimeoutError:
                raise
            except OSError as exc:
                self.close()
                raise AgentUnavailable(f"lost the agent at {self.socket_path!r}: {exc}") from None
            if not data:
                self.close()
                raise AgentUnavailable(f"the agent at {self.socket_path!r} closed the connection")
            self._decoder.feed(data)

    def _route(self, response: pb.Response) -> None:
        """A response that is not the awaited reply: a subscription's, or a stray."""
        sub = self._subscriptions.get(response.id)
        if sub is not None:
            sub._take(response)
        elif response.id == 0 and response.WhichOneof("body") == "error":
            self.close()  # the agent refused the connection itself (too many clients)
            raise agent_error(response.error.kind, response.error.message)
        # Otherwise the End of a subscription closed here, or a reply nobody awaits.

    def _pump(self, deadline: float | None) -> None:
        self._route(self._receive(deadline))


class AgentSubscription:
    """Items of one topic: iterate, or `receive(timeout)`; `close()` ends it."""

    def __init__(self, client: AgentClient, rid: int, topic: str, buffer: int) -> None:
        self._client = client
        self._rid = rid
        self.topic = topic
        self.buffer = buffer
        self._buffer = LagBuffer(buffer)
        self._ended: str | None = None  # why the subscription ended

    def _take(self, response: pb.Response) -> None:
        kind = response.WhichOneof("body")
        if kind == "end":
            self._ended = response.end.reason or "ended"
            self._client._subscriptions.pop(self._rid, None)
        elif kind == "item":
            item = item_from_pb(response.item)
            if isinstance(item, Lagged):
                self._buffer.add_lag(item.count)  # the agent's own drops
            else:
                self._buffer.put(item)

    @property
    def dropped(self) -> int:
        """Items dropped here because they were not taken in time."""
        return self._buffer.dropped

    def receive(self, timeout: float | None = None) -> Item | None:
        """The next item; None once the subscription has ended; TimeoutError when nothing
        came within `timeout` seconds (None: wait as long as it takes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (item := self._buffer.take()) is None:
            if self._ended is not None:
                return None
            self._client._pump(deadline)
        return item

    @property
    def ended(self) -> str | None:
        """Why the subscription ended, or None while it runs."""
        return self._ended

    def __iter__(self) -> Iterator[Item]:
        while (item := self.receive()) is not None:
            yield item

    def close(self) -> None:
        """End the subscription (the agent stops sending its items)."""
        if self._ended is not None:
            return
        self._ended = "closed"
        self._buffer.clear()
        if self._client._subscriptions.pop(self._rid, None) is None or self._client.closed:
            return
        # An AgentError: it had ended at the agent already, nothing left to stop.
        with contextlib.suppress(AgentError):
            self._client._call(unsubscribe=pb.Unsubscribe(subscribe_id=self._rid))

    def __enter__(self) -> AgentSubscription:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _receipts(reply: pb.Receipts) -> list[Receipt]:
    """The node's receipts as sent (an id the agent did not know travels as b"")."""
    return [
        Receipt(p.id or None, p.publisher or reply.publisher, p.seq, p.duplicate)
        for p in reply.published
    ]
