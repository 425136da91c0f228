"""Topics as a source: `spark.readStream.format("episub")` and `spark.read.format("episub")`.

The driver-side methods (`initialOffset`, `latestOffset`, `partitions`; a batch read's
`partitions`) ask the reachable nodes what they hold of each topic (`reach`) and let
planner.py decide the offsets and ranges; `read()` runs on an executor and takes its ranges
from that executor's own node, which follows the topic and fetches what it lacks from the
nodes known to hold it and from its neighbours. A range is the same rows whenever it is
read, so a re-run batch replays exactly, and a query restarted from its checkpoint in a new
application reads on from any node that still holds its rows.

Reachable, for a planner: the driver's node, its neighbours in the topic, the outside
nodes the deployment names (`register(spark, bootstrap=...)`, the `bootstrap` option),
and, on demand, a publisher's own node (a node's id is its address) when what the others
hold starts after the query's position.

Lag: `reportLatestOffset` gives Spark what is held (each publisher's last seq + 1), which
`query.lastProgress["sources"][0]["latestOffset"]` shows beside `endOffset`; `lag()` sums
the difference. PySpark 4.3 lets a Python source report no other metric (its stream has
no `metrics()` hook on the JVM side).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from episub.proto.reserved import INTERNAL_TOPIC_PREFIX, is_internal_stream
from episub.recordbatch import BatchFormatError, RecordBatch, is_batch
from spark_connector.deployment import (
    Deployment,
    driver_client,
    join_through,
    shared_executor_client,
)
from spark_connector.options import SourceOptions
from spark_connector.planner import (
    DataLossError,
    Holdings,
    OffsetPlanner,
    Offsets,
    Range,
    pack,
    publisher_bytes,
    publisher_text,
    union,
)
from spark_connector.rowmap import StreamRows, mixed, row_holding

__all__ = [
    "DataLossError",
    "EpisubBatchReader",
    "EpisubStreamReader",
    "RangePartition",
    "lag",
    "publisher_text",
]

log = logging.getLogger("spark_connector.source")

# Seconds each node asked gets to answer what it holds: a loaded LAN answers in ms; a node
# that takes longer is left out of this planning (and asked again at the next).
REACH_TIMEOUT = 2.0
# Publishers' own nodes asked at most per planning, when the others' holdings start late.
MAX_ON_DEMAND = 32
# Nodes that answered a planning, asked again at the next one whether neighbours or not.
MAX_KNOWN = 16


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """The ranges one task reads; all it needs travels with it (read() is stateless)."""

    ranges: tuple[Range, ...]
    deployment: Deployment
    fetch_timeout: float
    fail_on_data_loss: bool
    include_headers: bool = True


def lag(progress: Any) -> int | None:
    """Rows the episub sources of a query's progress (`query.lastProgress`) were behind
    after its last batch: what was held (latestOffset) past what they had read
    (endOffset); None when no source of the progress has episub's offsets."""
    if not progress:
        return None
    behind = None
    for source in progress["sources"]:
        latest, end = _offsets_of(source["latestOffset"]), _offsets_of(source["endOffset"])
        if latest is None or end is None:
            continue
        behind = (behind or 0) + sum(
            max(0, seq - end.get(topic, {}).get(publisher, seq))
            for topic, publishers in latest.items()
            for publisher, seq in publishers.items()
        )
    return behind


def _offsets_of(text: Any) -> Offsets | None:
    """Offsets in episub's shape ({topic: {publisher: seq}}), or None for any other."""
    import json

    try:
        found = json.loads(text) if isinstance(text, str) else text
    except (TypeError, ValueError):
        return None
    if not isinstance(found, dict) or not all(
        isinstance(per, dict) and all(isinstance(s, int) for s in per.values())
        for per in found.values()
    ):
        return None
    return found


class _Planning:
    """What stream and batch reads share: the topics, asking the reachable nodes."""

    options: SourceOptions
    deployment: Deployment

    def _topics(self, client: Any) -> list[str]:
        """The topics read: those named, or those matching subscribePattern that the driver's
        node, its neighbours and the outside contacts know of (asked at every planning, so
        a topic created later is read too, from its earliest held row)."""
        if self.options.pattern is None:
            return list(self.options.topics)
        pattern = re.compile(self.options.pattern)
        known = client.known_topics(
            neighbors=True, addresses=self.deployment.contacts, timeout=REACH_TIMEOUT
        )
        return [
            t for t in known if pattern.fullmatch(t) and not t.startswith(INTERNAL_TOPIC_PREFIX)
        ]

    def _reach(
        self, wanted: Offsets | None = None, since_ms: int = 0, earliest: bool = False
    ) -> tuple[list[str], dict[str, Holdings]]:
        """The topics read, and what the reachable nodes hold of each. `wanted`: where the
        query stands; a publisher the others hold only from later on is asked of its own
        node too (with `earliest`: every publisher they do not hold from seq 0)."""
        from episub.agent import AgentUnavailable

        try:
            return self._reach_once(wanted, since_ms, earliest)
        except AgentUnavailable as exc:
            # The driver's node ended while it was asked (killed, or crashed): driver_client
            # starts it again on its address, and the planning is asked of it once more.
            log.warning("the driver's episub node ended during planning (%s); asking again", exc)
            return self._reach_once(wanted, since_ms, earliest)

    def _reach_once(
        self, wanted: Offsets | None, since_ms: int, earliest: bool
    ) -> tuple[list[str], dict[str, Holdings]]:
        contacts = self.deployment.contacts
        # Nodes that answered before are asked (and joined through) again: a driver's node
        # that restarted has no neighbour yet, and they hold what it lost.
        known: dict[bytes, str] = getattr(self, "_known", {})
        with driver_client(self.deployment) as client:
            topics = self._topics(client)
            for topic in topics:
                join_through(client, topic, [*contacts, *known.values()])
            out = {}
            answered: dict[bytes, str] = {}
            for topic in topics:
                nodes = client.holdings(
                    topic,
                    neighbors=True,
                    peers=list(known)[:MAX_KNOWN],
                    addresses=contacts,
                    since_ms=since_ms,
                    timeout=REACH_TIMEOUT,
                )
                answered.update(
                    (n.node_id, n.address) for n in nodes[1:] if n.answered and n.node_id
                )
                answers = [(n.node_id, n.spans) for n in nodes if n.answered]
                held = self._in_rows(client, topic, union(answers))
                positions = dict((wanted or {}).get(topic, {}))
                if earliest:
                    positions.update({p: 0 for p in held if p not in positions})
                late = [
                    publisher_bytes(p)
                    for p, position in positions.items()
                    if p not in held or held[p].first > max(position, 0)
                ]
                own = [p for p in late if _is_node_id(p)][:MAX_ON_DEMAND]
                if own:
                    more = client.holdings(
                        topic, peers=own, since_ms=since_ms, timeout=REACH_TIMEOUT
                    )
                    answers += [(n.node_id, n.spans) for n in more[1:] if n.answered]
                    held = self._in_rows(client, topic, union(answers))
                out[topic] = held
            self._known = dict(list(answered.items())[:MAX_KNOWN])
        return topics, out

    def _in_rows(self, client: Any, topic: str, held: Holdings) -> Holdings:
        """Holdings in seqs made holdings in rows (see rowmap.py); the map is kept for the
        next planning and for locating the messages of each task's rows."""
        maps: dict[tuple[str, str], StreamRows] = self.__dict__.setdefault("_rows", {})
        out = {}
        for publisher, h in held.items():
            rows = maps.setdefault((topic, publisher), StreamRows())
            rows.update(client, topic, publisher_bytes(publisher), h.first, h.last, h.holders)
            found = row_holding(h, rows)
            if found is not None:
                out[publisher] = found
        for key in [k for k in maps if k[0] == topic and k[1] not in held]:
            del maps[key]  # held nowhere now: bounded by what is held
        return out

    def _located(self, rng: Range) -> Range:
        rows = self.__dict__.get("_rows", {}).get((rng.topic, rng.publisher))
        if rows is None or not rows.batched:
            return rng
        return dataclasses.replace(
            rng, first_msg=rows.seq_of(rng.first_seq), last_msg=rows.seq_of(rng.last_seq)
        )

    def _start(self, planner: OffsetPlanner) -> Offsets:
        o = self.options
        if o.starting_by_timestamp is not None:
            return self._start_by_publisher_time(planner)
        since = o.starting_timestamp or 0
        named = o.starting_offsets if isinstance(o.starting_offsets, dict) else None
        earliest = o.starting_offsets == "earliest" or any(
            seq == -2 for per in (named or {}).values() for seq in per.values()
        )
        topics, holdings = self._reach(wanted=named, since_ms=since, earliest=earliest)
        return planner.start_offsets(
            topics,
            o.starting_offsets,
            holdings,
            by_time=o.starting_timestamp is not None,
            strategy_latest=o.strategy_latest,
        )

    def _start_by_publisher_time(self, planner: OffsetPlanner) -> Offsets:
        """startingOffsetsByTimestamp: each named publisher from its first row stamped at
        or after its own time; publishers not named start as new ones do (earliest)."""
        o = self.options
        assert o.starting_by_timestamp is not None
        topics, holdings = self._reach()
        out = planner.start_offsets(topics, "earliest", holdings)
        times = {ms for per in o.starting_by_timestamp.values() for ms in per.values()}
        for ms in sorted(times):
            _, timed = self._reach(since_ms=ms)
            for topic, publishers in o.starting_by_timestamp.items():
                wanted = {p for p, t in publishers.items() if t == ms}
                held = {p: h for p, h in timed.get(topic, {}).items() if p in wanted}
                start = planner.start_offsets(
                    [topic], "earliest", {topic: held}, by_time=True,
                    strategy_latest=o.strategy_latest,
                )  # fmt: skip
                out.setdefault(topic, {}).update(start[topic])
        return out

    def _partitions(self, planner: OffsetPlanner, start: Offsets, end: Offsets) -> list[Any]:
        o = self.options
        if not all(planner.knows(t) for t in end):
            # A batch planned before a restart, run again by a new reader: its planner has
            # asked no node yet, and a task told no holder could ask only its neighbours.
            topics, holdings = self._reach(wanted=start)
            for topic in topics:
                if not planner.knows(topic):
                    planner.remember(topic, holdings[topic])
        tasks = pack(planner.ranges(start, end), o.max_rows_per_partition, o.min_partitions)
        return [
            RangePartition(
                ranges=tuple(self._located(r) for r in task),
                deployment=self.deployment,
                fetch_timeout=o.fetch_timeout,
                fail_on_data_loss=o.fail_on_data_loss,
                include_headers=o.include_headers,
            )
            for task in tasks
        ]


class EpisubStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow, _Planning):
    """`spark.readStream.format("episub")`. Spark keeps one instance per query in a
    driver-side process: its planner's memory lives here, made on first use."""

    def __init__(self, options: SourceOptions, deployment: Deployment) -> None:
        self.options = options
        self.deployment = deployment
        self._planner: OffsetPlanner | None = None
        self._target: Offsets | None = None  # Trigger.AvailableNow's end
        self._latest: Offsets | None = None  # what was held at the last planning (lag)

    @property
    def planner(self) -> OffsetPlanner:
        if self._planner is None:
            o = self.options
            self._planner = OffsetPlanner(
                fail_on_data_loss=o.fail_on_data_loss,
                min_rows=o.min_rows_per_trigger,
                max_trigger_delay=o.max_trigger_delay,
                now=time.monotonic(),
            )
        return self._planner

    # -- driver side ------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        return self._start(self.planner)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_rows_per_trigger is not None:
            return ReadMaxRows(self.options.max_rows_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        topics, holdings = self._reach()
        self._target = {t: {p: h.last + 1 for p, h in holdings[t].items()} for t in topics}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        topics, holdings = self._reach(wanted=start)
        self._latest = {t: {p: h.last + 1 for p, h in holdings[t].items()} for t in topics}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return self.planner.latest(
            start, topics, holdings, now=time.monotonic(), max_rows=max_rows, target=self._target
        )

    def reportLatestOffset(self) -> dict | None:
        return self._latest

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self._partitions(self.planner, start, end)

    def commit(self, end: dict) -> None:
        pass  # nothing to release: nodes keep history by retention, not by commits

    def stop(self) -> None:
        """The query ended: its planner's memory goes; the nodes stay (they serve other
        queries and retire on their own)."""
        self._planner = None
        self._latest = None

    # -- executor side ----------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RangePartition)
        return read_ranges(partition)


class EpisubBatchReader(DataSourceReader, _Planning):
    """`spark.read.format("episub")`: the rows between startingOffsets (default earliest)
    and endingOffsets (default latest, as held when the read is planned)."""

    def __init__(self, options: SourceOptions, deployment: Deployment) -> None:
        self.options = options
        self.deployment = deployment

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        planner = OffsetPlanner(fail_on_data_loss=o.fail_on_data_loss)
        start = self._start(planner)
        if o.ending_timestamp is not None:
            topics, holdings = self._reach(since_ms=o.ending_timestamp)
            end = planner.end_of_batch_read(topics, "latest", holdings, by_time=True)
        elif o.ending_by_timestamp is not None:
            topics, holdings = self._reach()
            end = planner.end_of_batch_read(topics, "latest", holdings)
            for ms in sorted({t for per in o.ending_by_timestamp.values() for t in per.values()}):
                _, timed = self._reach(since_ms=ms)
                for topic, publishers in o.ending_by_timestamp.items():
                    for publisher, t in publishers.items():
                        h = timed.get(topic, {}).get(publisher)
                        if t == ms and h is not None:
                            end.setdefault(topic, {})[publisher] = h.since
        else:
            topics, holdings = self._reach(wanted=start)
            end = planner.end_of_batch_read(topics, o.ending_offsets, holdings)
        # What the end names is read from the start; a publisher the start lacks, from its
        # earliest held seq (a batch read has no "next batch").
        for topic, publishers in end.items():
            begun = start.setdefault(topic, {})
            for publisher in publishers:
                h = holdings.get(topic, {}).get(publisher)
                if publisher not in begun and h is not None:
                    begun[publisher] = h.first
        planner.latest(start, list(end), holdings, now=0.0)  # data loss, as a stream would
        return self._partitions(planner, start, end)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, RangePartition):
            # Nothing to read (a topic nobody published to): partitions() gave none, and
            # Spark reads one partition of its own (None) instead. No rows.
            return iter(())
        return read_ranges(partition)


def _is_node_id(publisher: bytes) -> bool:
    """Is this publisher a node's own stream (its id says where the node listens)?"""
    from episub.net.peer_id import PeerIdError, parse_peer_id

    if is_internal_stream(publisher):
        return False
    try:
        parse_peer_id(publisher)
    except PeerIdError:
        return False
    return True


def _holders_now(client: Any, rng: Range, first: int, last: int) -> str:
    """What the nodes a task's fetch asks hold of first..last now, one clause each, for a
    DataLossError: which nodes were asked, and what each answered."""
    from episub.agent import AgentError, AgentUnavailable
    from episub.proto.messages import HeldSpan

    span = HeldSpan(publisher=publisher_bytes(rng.publisher), first_seq=first, last_seq=last)
    try:
        nodes = client.holdings(
            rng.topic, spans=[span], neighbors=True, peers=rng.holders[:MAX_KNOWN]
        )
    except (AgentError, AgentUnavailable) as exc:
        return f"the executor's agent could not ask ({exc})"
    clauses = []
    for i, node in enumerate(nodes):
        name = "this executor's node" if i == 0 else node.address or node.node_id.hex()[:16]
        if not node.answered:
            clauses.append(f"{name}: no answer")
        elif not node.spans:
            clauses.append(f"{name}: holds none")
        else:
            held = ", ".join(f"{s.first_seq}..{s.last_seq} ({s.count} seqs)" for s in node.spans)
            clauses.append(f"{name}: holds {held}")
    return "; ".join(clauses)


def read_ranges(partition: RangePartition) -> Iterator[Any]:
    """The rows of `partition`'s ranges, from this executor's node, as Arrow record
    batches: one per record-batch message (its rows in the range, over its own bytes), and
    one per page of plain messages (over the page's columns: no Python object per row)."""
    from spark_connector.arrow_rows import source_schema

    schema = source_schema(partition.include_headers)
    with shared_executor_client(partition.deployment) as client:
        joins = partition.deployment.joins()
        for topic in dict.fromkeys(r.topic for r in partition.ranges):
            # No history: a task fetches the ranges it reads; its node does not copy all
            # that its neighbours retain as well (each node would read it all again).
            client.join(topic, joins, history=False)
        for rng in partition.ranges:
            batched = rng.first_msg >= 0
            first, last = (
                (rng.first_msg, rng.last_msg) if batched else (rng.first_seq, rng.last_seq)
            )
            read = _batched_rows if batched else _plain_rows
            found = 0
            for rows in read(client, rng, first, last, partition.fetch_timeout, schema):
                found += rows.num_rows
                yield rows
            if found != rng.rows:
                lacking = rng.rows - found
                what = (
                    f"topic {rng.topic!r}, publisher {rng.publisher!r}: {lacking} of rows "
                    f"{rng.first_seq}..{rng.last_seq} were not found on this executor's node "
                    "nor on the nodes it asked (the planner's holders and its neighbours; "
                    f"it stops after {partition.fetch_timeout} s with nothing arriving). "
                    f"Asked again, seqs {first}..{last}: " + _holders_now(client, rng, first, last)
                )
                if partition.fail_on_data_loss:
                    raise DataLossError(f"{what}. Set failOnDataLoss=false to skip them.")
                log.warning("skipping %d lost rows: %s", lacking, what)


def _plain_rows(
    client: Any, rng: Range, first: int, last: int, fetch_timeout: float, schema: Any
) -> Iterator[Any]:
    """A range of plain messages (one row each, seqs first..last), page by page."""
    from spark_connector.arrow_rows import page_record_batch

    pages = client.read_range_rows(
        rng.topic,
        publisher_bytes(rng.publisher),
        first,
        last,
        fetch_timeout=fetch_timeout,
        holders=rng.holders,
    )
    for page in pages:
        for m in page.batches:
            raise mixed(rng.topic, m.publisher, m.seq, batch=True)
        if page.rows.rows:
            yield page_record_batch(rng.topic, rng.publisher, page.rows, page.seqs, schema)


def _batched_rows(
    client: Any, rng: Range, first: int, last: int, fetch_timeout: float, schema: Any
) -> Iterator[Any]:
    """A range of record batches (messages first..last holding rows first_seq..last_seq):
    each batch's rows in the range, over its own bytes."""
    from spark_connector.arrow_rows import batch_record_batch

    messages = client.read_range(
        rng.topic,
        publisher_bytes(rng.publisher),
        first,
        last,
        fetch_timeout=fetch_timeout,
        holders=rng.holders,
    )
    for m in messages:
        if not is_batch(m.headers):
            raise mixed(rng.topic, m.publisher, m.seq, batch=False)
        try:
            batch = RecordBatch.decode(m.value)
        except BatchFormatError as exc:
            log.warning(
                "a record batch at seq %d of %r is unreadable: %s", m.seq, rng.publisher, exc
            )
            continue
        out = batch_record_batch(
            rng.topic, rng.publisher, batch, rng.first_seq, rng.last_seq, schema
        )
        if out is not None:
            yield out
