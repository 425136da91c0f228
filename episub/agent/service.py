"""What the agent does with its node, apart from any socket: the requests' meaning.

server.py carries requests over a Unix socket and calls this; the CLI's `episub node` calls
it directly for `--topic`. Everything a client can ask for is bounded here or there
(`AgentLimits`), and a request the agent refuses raises the AgentError of its cause
(episub/agent/errors.py, the client's own classes), which the server turns into an Error
reply of that kind.

Choices:
- Joining a topic already joined is a no-op, so every worker can just `join` what it uses;
  concurrent joins of one topic wait for the first. A join with no bootstrap addresses uses
  the agent's own list (given at start), or starts the topic's overlay when that is empty.
- Leaving is for the whole agent: every client of it loses the topic (Spark workers never
  leave; the agent leaves everything when it exits).
- `offsets(topic)` is what the node's retention holds of the topic (Node.held): retention
  is the one owner of per-publisher positions. `holdings` asks other nodes the same
  (GETHELD), in parallel, each within a timeout: what a Spark planner calls "reachable".
- A publish reports (publisher, seq) next to the id, from `Node.publish_record`; a record
  may name its stream place (a Spark sink row), and a taken place reports `duplicate`.
- Live configurations (episub.config) are kept here, one replica per name, started by the
  first read or write of that name and kept until the agent exits: short-lived workers
  come and go, the agent's replica stays current for the next one.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import trio

from episub.agent import agent_pb2 as pb
from episub.agent.errors import AgentAtLimit, AgentBadRequest, AgentTooLarge, AgentWaitExpired
from episub.agent.readahead import ReadAhead
from episub.agent.wire import (
    MAX_BATCH_RECORDS,
    MAX_REQUEST_SIZE,
    delivery_to_pb,
    envelope_rows_to_pb,
    neighbor_to_pb,
    record_from_pb,
    rows_to_pb,
    span_from_pb,
    span_to_pb,
)
from episub.config import DELETE, ConfigLimitError, ConfigReplica
from episub.config.codec import value_of
from episub.config.state import Entry
from episub.crawl import CRAWL_MAX_NODES, CRAWL_TIMEOUT, crawl
from episub.net.handshake import HandshakeError
from episub.net.peer_id import PeerIdError, parse_address, parse_peer_id
from episub.node import HELD_TIMEOUT, Node
from episub.proto.envelope import Envelope
from episub.proto.messages import MAX_HELD_SPANS, HeldSpan, check_topic_name
from episub.recordbatch import is_batch
from episub.records import Delivery

__all__ = ["AgentLimits", "AgentService", "config_snapshot_to_pb"]

_Stored = TypeVar("_Stored", Envelope, Delivery)  # what a page is filled with

log = logging.getLogger("episub.agent")

# A first read of a configuration waits this long at most for the replica to catch up
# from its neighbours (each asked for SYNC_TIMEOUT); past it, it answers what it has.
CONFIG_SYNC_WAIT = 10.0  # guess: a few neighbours' worth
# The longest a client may ask a join to wait for its first neighbour (Join.timeout).
MAX_JOIN_TIMEOUT = 120.0


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentLimits:
    max_clients: int = 64  # guess: a few workers per task slot, plus tools; Spark has ~16 slots
    max_in_flight: int = 64  # guess: requests per client at once, subscriptions apart
    max_subscriptions: int = 16  # guess: per client; a worker reads a handful of topics
    max_subscription_buffer: int = 65_536  # guess: 64x the node's default of 1,024
    max_batch_records: int = MAX_BATCH_RECORDS  # see wire.py
    max_bootstrap: int = 64  # guess: a deployment lists a handful of seed addresses
    max_request_size: int = MAX_REQUEST_SIZE
    read_page_bytes: int = 16 * 1024 * 1024  # a ReadRange reply's size, see wire.py
    read_page_messages: int = 10_000  # guess: a micro-batch reads several pages at most
    max_fetch_timeout: int = 120  # seconds a read may wait on neighbours; guess: 12x Node's
    max_configs: int = 16  # live configurations per agent; guess: one or two per application
    max_config_wait: int = 600  # seconds a ConfigRead may wait for a version; guess
    max_overlay_nodes: int = 1024  # nodes one Overlay walk asks; guess: a big cluster, ~1 MB
    max_overlay_timeout: int = 60  # seconds one Overlay walk may take; guess: 6x its default
    max_holdings_nodes: int = 64  # nodes one Holdings/KnownTopics names; guess: as bootstrap
    max_holdings_timeout: int = 60  # seconds each node asked may take; guess: 30x HELD_TIMEOUT

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"AgentLimits.{name} must be an int >= 1, not {value!r}")


class AgentService:
    """The agent's operations on `node` (running); `run` must be started before `join`.

    bootstrap: addresses a join with none of its own uses.
    """

    def __init__(
        self,
        node: Node,
        *,
        bootstrap: Sequence[str] = (),
        limits: AgentLimits | None = None,
    ) -> None:
        self.node = node
        self.bootstrap = list(bootstrap)
        self.limits = limits or AgentLimits()
        self._nursery: trio.Nursery | None = None
        self._started = time.monotonic()
        self._joined: dict[str, None] = {}  # the topics joined, in the order joined
        self._joining: dict[str, trio.Event] = {}
        self._configs: dict[str, ConfigReplica] = {}
        self._read_ahead = ReadAhead(node)
        self.metrics_url = ""  # set by the runner when it serves Prometheus metrics

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hosts the configuration replicas' tasks until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- topics -----------------------------------------------------------------------------

    async def join(
        self,
        topic: str,
        bootstrap: Sequence[str] | None = None,
        timeout: float = 0.0,
        history: bool = True,
    ) -> bool:
        """Join `topic` (through the agent's bootstrap list when `bootstrap` is empty);
        False when it was joined already. Concurrent joins of one topic wait for the first.
        AgentWaitExpired when no neighbour came within `timeout` seconds (0: the
        node's default), joined all the same."""
        check_topic_name(topic)
        contacts = list(bootstrap) if bootstrap else self.bootstrap
        while topic not in self._joined:
            pending = self._joining.get(topic)
            if pending is None:
                break
            await pending.wait()
        else:
            return False
        done = self._joining[topic] = trio.Event()
        try:
            try:
                if timeout > 0:
                    await self.node.join(topic, contacts, timeout=timeout, history=history)
                else:
                    await self.node.join(topic, contacts, history=history)
            except TimeoutError as exc:
                # Joined, but no neighbour yet: the node stays joined and keeps trying, so
                # the topic counts as joined here too; the caller still hears of it.
                self._joined[topic] = None
                log.warning("%s", exc)
                raise AgentWaitExpired(str(exc)) from None
            self._joined[topic] = None
            log.info("joined %r through %s", topic, ", ".join(contacts) or "nobody (first node)")
            return True
        finally:
            del self._joining[topic]
            done.set()

    async def leave(self, topic: str) -> None:
        """Leave `topic` (what retention holds of it can still be read by range)."""
        if topic not in self._joined:
            raise AgentBadRequest(f"not joined to topic {topic!r}")
        del self._joined[topic]
        await self.node.leave(topic)
        log.info("left %r", topic)

    @property
    def topics(self) -> list[str]:
        return sorted([*self._joined, *(r.topic for r in self._configs.values())])

    # -- requests ---------------------------------------------------------------------------

    async def join_request(self, body: pb.Join) -> None:
        if len(body.bootstrap) > self.limits.max_bootstrap:
            raise AgentAtLimit(
                f"at most {self.limits.max_bootstrap} bootstrap addresses, "
                f"not {len(body.bootstrap)}",
            )
        if not 0 <= body.timeout <= MAX_JOIN_TIMEOUT:  # NaN fails too
            raise AgentBadRequest(
                f"join timeout must be in 0..{MAX_JOIN_TIMEOUT:g} s, not {body.timeout}",
            )
        await self.join(body.topic, list(body.bootstrap), body.timeout, not body.no_history)

    async def publish(self, topic: str, records: Sequence[pb.Record]) -> pb.Receipts:
        if topic not in self._joined:
            raise AgentBadRequest(f"not joined to topic {topic!r}: join it first")
        if not records:
            raise AgentBadRequest("a batch needs at least one record")
        if len(records) > self.limits.max_batch_records:
            raise AgentAtLimit(
                f"at most {self.limits.max_batch_records} records per batch, not {len(records)}",
            )
        # Checked once, here, where the records enter (envelope.Record), and trusted after;
        # the node refuses the whole batch (all or none) for a record too large.
        count = len(records)
        checked = []
        for i, r in enumerate(records):
            try:
                checked.append(record_from_pb(r))
            except (TypeError, ValueError) as exc:
                where = f"record {i} of {count}: " if count > 1 else ""
                raise AgentBadRequest(f"{where}{exc}") from None
        receipts = await self.node.publish_many(topic, checked)
        out = pb.Receipts(publisher=self.node.id)
        for record, receipt in zip(checked, receipts, strict=True):
            out.published.add(
                id=receipt.id or b"",
                seq=receipt.seq,
                publisher=receipt.publisher if record.stream is not None else b"",
                duplicate=receipt.duplicate,
            )
        return out

    async def read_range(self, body: pb.ReadRange) -> pb.Messages:
        first, last = body.first_seq, body.last_seq
        if first > last:
            raise AgentBadRequest(f"need first_seq <= last_seq, not {first}..{last}")
        timeout = body.fetch_timeout
        if not 0 <= timeout <= self.limits.max_fetch_timeout:
            raise AgentBadRequest(
                f"fetch_timeout must be in 0..{self.limits.max_fetch_timeout} s, not {timeout}",
            )
        if body.as_rows and body.value_prefix:
            raise AgentBadRequest("as_rows and value_prefix do not go together")
        if len(body.holders) > self.limits.max_holdings_nodes:
            raise AgentAtLimit(
                f"at most {self.limits.max_holdings_nodes} holders, not {len(body.holders)}",
            )
        # One page at most: a client reading a long range asks page by page.
        upto = min(last, first + self.limits.read_page_messages - 1)
        if timeout > 0 and body.topic in self._joined:
            assert self._nursery is not None  # joined: run() has started
            upto = await self._read_ahead.page_end(
                self._nursery, body.topic, body.publisher, first, upto, last, timeout,
                list(body.holders),
            )  # fmt: skip
        out = pb.Messages(next_seq=upto + 1)
        if body.as_rows:
            stored = self.node.retained_envelopes(body.topic, body.publisher, first, upto)
            if not any(e.headers and is_batch(e.headers) for e in stored):
                # Plain rows (the usual page): columns straight from the envelopes.
                envelope_rows_to_pb(self._fill(stored, 0, out), out)
                return out
        found = self.node.retained(body.topic, body.publisher, first, upto)
        prefix = body.value_prefix
        page = self._fill(found, prefix, out)
        if body.as_rows:
            rows_to_pb(page, out)
            return out
        for message in page:
            encoded = delivery_to_pb(message)
            if prefix:
                encoded.value = encoded.value[:prefix]
            out.messages.append(encoded)
        return out

    def _fill(self, found: list[_Stored], prefix: int, out: pb.Messages) -> list[_Stored]:
        """The first of `found` that fit one page (read_page_bytes, read_page_messages,
        values counted cut to `prefix` when it is > 0); where the page stopped short, the
        seq the client asks from next goes to out.next_seq."""
        size = 0
        page: list[_Stored] = []
        for message in found:
            if page and (
                size + message.size > self.limits.read_page_bytes
                or len(page) >= self.limits.read_page_messages
            ):
                out.next_seq = message.seq  # the page is full: the client asks again from here
                break
            page.append(message)
            size += message.size if not prefix else min(message.size, prefix)
        return page

    def offsets(self, topic: str) -> pb.Offsets:
        """What this node's retention holds of `topic`, per publisher."""
        check_topic_name(topic)
        out = pb.Offsets()
        for publisher, span in self.node.held(topic).items():
            out.publishers.add(
                publisher=publisher,
                first_retained_seq=span.first,
                last_seq=span.last,
                count=span.count,
            )
        return out

    async def holdings(self, body: pb.Holdings) -> pb.HoldingsMap:
        """What this node and the nodes the request names hold of a topic (see agent.proto),
        asked in parallel; a node that cannot be reached or does not answer in time is in
        the answer with answered = false."""
        check_topic_name(body.topic)
        limits = self.limits
        if len(body.spans) > MAX_HELD_SPANS:
            raise AgentAtLimit(f"at most {MAX_HELD_SPANS} spans, not {len(body.spans)}")
        named = len(body.peers) + len(body.addresses)
        if named > limits.max_holdings_nodes:
            raise AgentAtLimit(
                f"a Holdings request names at most {limits.max_holdings_nodes} nodes"
            )
        timeout = self._node_timeout(body.timeout)
        try:
            spans = tuple(span_from_pb(s) for s in body.spans)
        except ValueError as exc:
            raise AgentBadRequest(f"a span: {exc}") from None
        targets = await self._targets(
            body.topic, body.neighbors, body.peers, body.addresses, timeout
        )
        answers: dict[int, list[HeldSpan] | None] = {}

        async def ask(i: int, peer: bytes) -> None:
            answers[i] = await self.node.held_by(
                body.topic, peer, spans=spans, since_ms=body.since_ms, timeout=timeout
            )

        async with trio.open_nursery() as nursery:
            for i, (peer, _) in enumerate(targets):
                if peer:
                    nursery.start_soon(ask, i, peer)
        out = pb.HoldingsMap()
        for i, (peer, address) in enumerate(targets):
            found = answers.get(i)
            entry = out.nodes.add(node_id=peer, address=address, answered=found is not None)
            for span in found or ():
                span_to_pb(span, entry.spans.add())
        return out

    async def known_topics(self, body: pb.KnownTopics) -> pb.TopicList:
        """The topics this node, its neighbours (with `neighbors`) and the nodes at
        `addresses` are in: what a subscribePattern matches against."""
        if len(body.addresses) > self.limits.max_holdings_nodes:
            raise AgentAtLimit(f"at most {self.limits.max_holdings_nodes} addresses per request")
        timeout = self._node_timeout(body.timeout)
        targets = await self._targets(None, body.neighbors, (), body.addresses, timeout)
        names: set[str] = set(self._joined)

        async def ask(peer: bytes) -> None:
            names.update(await self.node.topics_of(peer, timeout=timeout) or ())

        async with trio.open_nursery() as nursery:
            for peer, _ in targets:
                if peer and peer != self.node.id:
                    nursery.start_soon(ask, peer)
        return pb.TopicList(topics=sorted(names))

    def _node_timeout(self, asked: float) -> float:
        timeout = asked or HELD_TIMEOUT
        if not 0 < timeout <= self.limits.max_holdings_timeout:
            raise AgentBadRequest(
                f"timeout must be in 0..{self.limits.max_holdings_timeout} s, not {asked}",
            )
        return timeout

    async def _targets(
        self,
        topic: str | None,
        neighbors: bool,
        peers: Sequence[bytes],
        addresses: Sequence[str],
        timeout: float,
    ) -> list[tuple[bytes, str]]:
        """(node id, address) of this node, then its neighbours (of `topic`, or of every
        topic), the named ids and the nodes at `addresses` (connected to learn their ids,
        b"" when that fails), each once."""
        node = self.node
        found: dict[bytes, str] = {node.id: node.address}
        if neighbors:
            for name in [topic] if topic is not None else self.topics:
                for n in node.neighbors(name) if name in self._joined else ():
                    found.setdefault(n.peer_id, n.address)
        for peer in peers:
            found.setdefault(peer, _address_of(peer))
        unreachable: list[str] = []

        async def reach(address: str) -> None:
            with trio.move_on_after(timeout):
                try:
                    found.setdefault(await node.peer_at(address), address)
                    return
                except (OSError, HandshakeError, PeerIdError) as exc:
                    log.info("cannot reach %s to ask it: %s", address, exc)
            unreachable.append(address)

        own = parse_address(node.address)
        async with trio.open_nursery() as nursery:
            for address in addresses:
                try:
                    if parse_address(address) == own:
                        continue  # this node, asked first already
                except PeerIdError as exc:
                    raise AgentBadRequest(str(exc)) from None
                nursery.start_soon(reach, address)
        return [*found.items(), *((b"", a) for a in unreachable)]

    # -- live configuration -------------------------------------------------------------------

    async def config(self, name: str) -> ConfigReplica:
        """The replica of configuration `name`, started (and caught up) on first use."""
        replica = self._configs.get(name)
        if replica is None:
            if len(self._configs) >= self.limits.max_configs:
                raise AgentAtLimit(f"at most {self.limits.max_configs} configurations per agent")
            assert self._nursery is not None, "config() needs AgentService.run started"
            replica = self._configs[name] = ConfigReplica(self.node, name, bootstrap=self.bootstrap)
            try:
                await self._nursery.start(replica.run)
            except BaseException:
                del self._configs[name]
                raise
            log.info("started the replica of configuration %r", name)
        with trio.move_on_after(CONFIG_SYNC_WAIT):
            await replica.synced.wait()
        return replica

    async def config_read(self, body: pb.ConfigRead) -> pb.ConfigSnapshot:
        if not 0 <= body.timeout <= self.limits.max_config_wait:
            raise AgentBadRequest(
                f"timeout must be in 0..{self.limits.max_config_wait} s, not {body.timeout}",
            )
        replica = await self.config(body.name)
        if body.min_version and not await replica.wait_for(body.min_version, body.timeout):
            raise AgentWaitExpired(
                f"configuration {body.name!r} is at version {replica.state.version}, not yet "
                f"{body.min_version}, after {body.timeout} s"
                + (f" (behind: it knows of version {replica.state.top})" if replica.behind else ""),
            )
        return config_snapshot_to_pb(replica)

    async def config_write(self, body: pb.ConfigWrite) -> pb.ConfigSnapshot:
        changes: dict[str, object] = {}
        for value in body.set:
            if value.kind not in ("json", "bytes"):
                raise AgentBadRequest(f"a value's kind is 'json' or 'bytes', not {value.kind!r}")
            # The client sends JSON as text; it is checked by parsing it back here.
            entry = Entry(1, b"-", value.kind, value.data)  # type: ignore[arg-type]
            try:
                changes[value.key] = value_of(entry)
            except ValueError as exc:
                raise AgentBadRequest(f"value of {value.key!r}: {exc}") from None
        for key in body.delete:
            changes[key] = DELETE
        replica = await self.config(body.name)
        try:
            await replica.write(changes)
        except ConfigLimitError as exc:
            raise AgentTooLarge(str(exc)) from None
        return config_snapshot_to_pb(replica)

    async def overlay(self, body: pb.Overlay) -> pb.OverlayMap:
        """Walk the topic's overlay (episub.crawl), within the agent's bounds."""
        check_topic_name(body.topic)
        max_nodes = body.max_nodes or CRAWL_MAX_NODES
        if max_nodes > self.limits.max_overlay_nodes:
            raise AgentAtLimit(
                f"an overlay walk asks at most {self.limits.max_overlay_nodes} nodes"
            )
        timeout = body.timeout or CRAWL_TIMEOUT
        if not 0 < timeout <= self.limits.max_overlay_timeout:
            raise AgentBadRequest(
                f"timeout must be in 0..{self.limits.max_overlay_timeout} s, not {timeout}",
            )
        out = pb.OverlayMap()
        for view in await crawl(self.node, body.topic, max_nodes=max_nodes, timeout=timeout):
            entry = out.nodes.add(
                node_id=view.peer_id,
                address=view.address,
                answered=view.answered,
                passive_count=view.passive_count,
            )
            entry.neighbors.extend(neighbor_to_pb(n) for n in view.neighbors)
        return out

    def node_info(self, extra_stats: Mapping[str, int]) -> pb.NodeInfo:
        out = pb.NodeInfo(node_id=self.node.id, address=self.node.address, pid=os.getpid())
        for topic in self.topics:
            view = out.topics.add(topic=topic)
            view.neighbors.extend(neighbor_to_pb(n) for n in self.node.neighbors(topic))
        stats = dict(self.node.stats())
        stats.update(extra_stats)
        for replica in self._configs.values():
            for counter, value in replica.counters.items():
                stats[f"config_{counter}"] = stats.get(f"config_{counter}", 0) + value
        stats["agent_uptime_s"] = int(time.monotonic() - self._started)
        out.stats.update(stats)
        out.metrics_url = self.metrics_url
        return out


def _address_of(peer: bytes) -> str:
    try:
        return str(parse_peer_id(peer))
    except PeerIdError:
        return ""


def config_snapshot_to_pb(replica: ConfigReplica) -> pb.ConfigSnapshot:
    state = replica.state
    out = pb.ConfigSnapshot(name=replica.name, version=state.version, known_version=state.top)
    for key, entry in sorted(state.values().items()):
        out.entries.add(
            key=key, version=entry.version, writer=entry.writer, kind=entry.kind, data=entry.data
        )
    return out
