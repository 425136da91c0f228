"""Topics as a sink: `df.writeStream.format("episub")` and `df.write.format("episub")`.

Columns: `value` (binary or string, required), `key` (binary or string), `headers`
(array of struct<key: string, value: binary>, Kafka's shape, or map<string, binary>), and
`topic` (string: the row's topic, one of the `topic` option's, instead of its first). Names
match as Spark matches them, whatever their case. Each task publishes through its own
executor's node.

Rows arrive as Arrow record batches (the Arrow writers) and travel as episub record
batches (episub/recordbatch.py): `batchSize` rows a message, fewer past 960 KiB, cut by the
rows alone (arrow_rows.Chunker), so the same rows always make the same messages; each row
keeps its own offset in its stream (the stream's rows are numbered on without gaps).

One message per place, exactly once toward subscribers. A row's place does not depend on
which executor or which attempt writes it: partition p of a streaming query writes its
rows, in the order the partition yields them, as record batches at the next places of a
stream of its own,
`sink/<query>/<generation>/<p>`, one stream per partition for the life of the query, not
one per batch (so the source's offsets stay small). Where batch B's rows start in each
stream comes from the sink's index: after every batch, the driver's commit publishes the
streams' ends (next place and next row) at place B of a control stream,
`_episub/sink/<query>` (held and relayed in the topic like any message, never delivered
to subscribers), and batch B+1's tasks read
place B back from the driver's node. A retried task or a re-run batch (after a driver
restart too: the index is held by every node of the topic) so names the same places; it
first fetches what an earlier attempt wrote there, so taken places publish nothing, and
stamps its rows with that attempt's timestamp, so a place written twice anyway is the same
message (same id). With no index to go on (the query's first batch, or an index aged out
of every node) the batch starts a new generation of streams.

Acknowledgement (`acks`, Kafka's names): `local` returns once the task's own node took
the rows; `1` (default) once another node holds every row (an executor killed right after
its task committed loses nothing); `all` once every neighbour of the task's node in the
topic holds every row.

A batch write (`df.write`) uses streams `sink/<write>/0/<p>`, the write's id drawn once on
the driver, which covers its task retries.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    MapType,
    StringType,
    StructType,
)

from episub.proto.envelope import MAX_SEQ
from episub.proto.messages import HeldSpan
from episub.proto.reserved import SINK_INDEX_PREFIX, sink_stream
from episub.recordbatch import BATCH_HEADER
from spark_connector.arrow_rows import Chunker, to_payload
from spark_connector.deployment import (
    Deployment,
    driver_client,
    join_through,
    shared_executor_client,
)
from spark_connector.options import OptionError, SinkOptions

__all__ = [
    "Columns",
    "EpisubBatchWriter",
    "EpisubStreamWriter",
    "IndexFound",
    "SinkCommit",
    "SinkIndex",
    "check_sink_schema",
]

log = logging.getLogger("spark_connector.sink")

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # StreamExecution.QUERY_ID_KEY
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # MicroBatchExecution.BATCH_ID_KEY
_TEXT_OR_BINARY = (StringType, BinaryType)
# Seconds each node asked gets to say what it holds (sink index, earlier attempts, acks).
ASK_TIMEOUT = 2.0
ACK_POLL = (0.005, 0.25)  # first and longest wait between two looks at the acks


class SinkAckTimeout(RuntimeError):
    """Rows a task published were not held by other nodes within `ackTimeout`."""


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task did: where its rows went, record batches published, places taken
    already (by an earlier attempt)."""

    partition: int
    published: int
    duplicates: int
    query: str = ""  # streaming: the query's short id, the batch and the generation used
    batch: int = -1
    generation: int = 0
    # topic: (first place, places, first row, rows) written
    written: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    index: IndexFound | None = None  # the sink index the bases came from
    node: str = ""  # the address of the node that wrote (the commit joins through it)


@dataclass(frozen=True)
class SinkIndex:
    """Where each partition's stream of each topic ends after a batch (place B of the
    query's control stream)."""

    batch: int
    generation: int
    ends: dict[str, dict[int, int]]  # topic -> partition -> next place
    rows: dict[str, dict[int, int]] = field(default_factory=dict)  # ... -> next row offset

    def to_json(self) -> bytes:
        def text(ends: dict[str, dict[int, int]]) -> dict:
            return {
                t: {str(p): e for p, e in sorted(per.items())} for t, per in sorted(ends.items())
            }

        body = {
            "batch": self.batch,
            "generation": self.generation,
            "ends": text(self.ends),
            "rows": text(self.rows),
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> SinkIndex:
        body = json.loads(data)

        def ints(ends: dict) -> dict[str, dict[int, int]]:
            return {t: {int(p): int(e) for p, e in per.items()} for t, per in ends.items()}

        ends = ints(body["ends"])
        # An index without rows is from streams of one row per place.
        rows = ints(body["rows"]) if "rows" in body else {t: dict(per) for t, per in ends.items()}
        return cls(int(body["batch"]), int(body["generation"]), ends, rows)


@dataclass(frozen=True)
class Columns:
    """The DataFrame's columns the sink reads, by position (matched case-insensitively)."""

    value: int
    key: int | None
    headers: int | None
    topic: int | None


def check_sink_schema(schema: StructType, options: SinkOptions) -> Columns:
    """Refuse a DataFrame the sink cannot write, naming the column and what it must be."""
    found: dict[str, int] = {}
    for i, f in enumerate(schema.fields):
        low = f.name.lower()
        if low in ("value", "key", "headers", "topic"):
            if low in found:
                raise OptionError(
                    f"columns {schema.fields[found[low]].name!r} and {f.name!r} differ only in "
                    "case: the sink cannot tell which to write"
                )
            found[low] = i
    if "value" not in found:
        raise OptionError(
            f"the episub sink needs a 'value' column (binary or string); the DataFrame has "
            f"{', '.join(schema.fieldNames()) or 'no columns'}"
        )
    for name in ("value", "key", "topic"):
        if name not in found:
            continue
        column = schema.fields[found[name]]
        allowed = (StringType,) if name == "topic" else _TEXT_OR_BINARY
        if not isinstance(column.dataType, allowed):
            kinds = " or ".join(t.typeName() for t in allowed)
            raise OptionError(
                f"column {column.name!r} must be {kinds}, not {column.dataType.simpleString()}"
            )
    if "headers" in found and not _headers_type(schema.fields[found["headers"]].dataType):
        raise OptionError(
            f"column {schema.fields[found['headers']].name!r} must be "
            "array<struct<key:string,value:binary>> or map<string,binary>, not "
            f"{schema.fields[found['headers']].dataType.simpleString()}"
        )
    if not options.topics:
        what = "a 'topic' column names each row's topic" if "topic" in found else "rows need one"
        raise OptionError(
            f'the episub sink needs option "topic" ({what}): the topics it may write, the '
            "first the default for rows with no topic, so that every node joins them before "
            "a row is written"
        )
    return Columns(
        value=found["value"],
        key=found.get("key"),
        headers=found.get("headers"),
        topic=found.get("topic"),
    )


def _headers_type(kind: object) -> bool:
    if isinstance(kind, MapType):
        return isinstance(kind.keyType, StringType) and isinstance(kind.valueType, _TEXT_OR_BINARY)
    if isinstance(kind, ArrayType) and isinstance(kind.elementType, StructType):
        names = [f.name for f in kind.elementType.fields]
        types = [f.dataType for f in kind.elementType.fields]
        return (
            names == ["key", "value"]
            and isinstance(types[0], StringType)
            and isinstance(types[1], _TEXT_OR_BINARY)
        )
    return False


# -- a task's write -------------------------------------------------------------------------


@dataclass
class _TopicWrite:
    """One topic's rows of one task: record batches at places base, base+1, ... of
    `stream`, their rows numbered on from `base_row`."""

    topic: str
    stream: bytes
    base: int
    base_row: int
    stamp: int  # every row's timestamp (ms): an earlier attempt's, or when this one began
    chunker: Chunker
    places: int = 0
    rows: int = 0


class _PartitionWriter:
    """Writes one partition's rows through its executor's node (see the module doc)."""

    def __init__(
        self,
        client: Any,
        deployment: Deployment,
        options: SinkOptions,
        stream: bytes,
        bases: dict[str, tuple[int, int]],
    ) -> None:
        self.client = client
        self.deployment = deployment
        self.options = options
        self.stream = stream
        self.bases = bases  # topic -> (first place, first row) (absent: 0, 0)
        self.topics: dict[str, _TopicWrite] = {}
        self.published = self.duplicates = 0
        self.rows = 0

    def add(self, topic: str, rows: Any) -> None:
        """Rows of one topic (an Arrow batch with columns value, key, headers)."""
        write = self.topics.get(topic)
        if write is None:
            write = self.topics[topic] = self._begin(topic)
        self._publish(write, write.chunker.add(rows))

    def _begin(self, topic: str) -> _TopicWrite:
        """Join the topic; find what an earlier attempt wrote at this task's places (they
        are taken: publishing them again publishes nothing) and take its stamp, so a place
        written again is the same message."""
        client = self.client
        client.join(topic, self.deployment.joins())
        base, base_row = self.bases.get(topic, (0, 0))
        asked = HeldSpan(publisher=self.stream, first_seq=base, last_seq=MAX_SEQ)
        nodes = client.holdings(
            topic,
            spans=[asked],
            neighbors=True,
            addresses=_driver(self.deployment),
            timeout=ASK_TIMEOUT,
        )
        spans = [(n.node_id, s) for n in nodes if n.answered for s in n.spans]
        stamp = int(time.time() * 1000)
        if spans:
            last = max(s.last_seq for _, s in spans)
            holders = [node for node, _ in spans if node]
            earlier = client.read_range(
                topic, self.stream, base, base, fetch_timeout=ASK_TIMEOUT, holders=holders,
                value_prefix=1,
            )  # fmt: skip
            if earlier:
                stamp = earlier[0].timestamp_ms
                log.info(
                    "topic %r, stream %r: an earlier attempt wrote places %d..%d; they are "
                    "not published again",
                    topic, self.stream, base, last,
                )  # fmt: skip
        return _TopicWrite(
            topic, self.stream, base, base_row, stamp, Chunker(max_rows=self.options.batch_size)
        )

    def _publish(self, write: _TopicWrite, batches: Iterator[Any]) -> None:
        from episub.agent import Record

        records = []
        for rows in batches:
            columns = rows.schema.names
            payload = to_payload(
                write.base_row + write.rows,
                write.stamp,
                rows.column("value"),
                rows.column("key") if "key" in columns else None,
                rows.column("headers") if "headers" in columns else None,
            )
            records.append(
                Record(
                    value=payload,
                    headers=((BATCH_HEADER, b"1"),),
                    stream=(write.stream, write.base + write.places),
                    timestamp_ms=write.stamp,
                )
            )
            write.places += 1
            write.rows += rows.num_rows
            self.rows += rows.num_rows
        if records:
            for receipt in self.client.publish_batch(write.topic, records):
                if receipt.duplicate:
                    self.duplicates += 1
                else:
                    self.published += 1

    def finish(self) -> dict[str, tuple[int, int, int, int]]:
        """Publish what is pending, wait for the acknowledgements; per topic (first place,
        places, first row, rows)."""
        for write in self.topics.values():
            self._publish(write, write.chunker.finish())
        for write in self.topics.values():
            if write.places:
                await_acks(
                    self.client,
                    write.topic,
                    HeldSpan(
                        publisher=write.stream,
                        first_seq=write.base,
                        last_seq=write.base + write.places - 1,
                    ),
                    self.options.acks,
                    self.options.ack_timeout,
                )
        return {w.topic: (w.base, w.places, w.base_row, w.rows) for w in self.topics.values()}


def await_acks(client: Any, topic: str, span: HeldSpan, acks: str, timeout: float) -> None:
    """Return once other nodes hold every seq of `span`: one of them (acks "1"), or every
    neighbour of this node in the topic ("all"); at once for "local". SinkAckTimeout past
    `timeout` seconds."""
    if acks == "local":
        return
    need = span.last_seq - span.first_seq + 1
    deadline = time.monotonic() + timeout
    pause = ACK_POLL[0]
    while True:
        nodes = client.holdings(topic, spans=[span], neighbors=True, timeout=ASK_TIMEOUT)
        others = nodes[1:]  # the first is this node
        full = [n for n in others if n.answered and sum(s.count for s in n.spans) >= need]
        if acks == "1" and full:
            return
        if acks == "all" and others and len(full) == len(others):
            return
        if time.monotonic() > deadline:
            raise SinkAckTimeout(
                f"topic {topic!r}, stream {span.publisher!r}: places "
                f"{span.first_seq}..{span.last_seq} ({need} rows) were not held by "
                f"{'another node' if acks == '1' else 'every neighbour'} within {timeout} s "
                f"(acks={acks}; {_answers(others)})"
            )
        time.sleep(pause)  # the next look: no event tells a blocking client of a copy
        pause = min(ACK_POLL[1], pause * 2)


def _answers(others: list[Any]) -> str:
    """What each neighbour asked last answered, for an ack timeout's message."""
    if not others:
        return "this node has no neighbour in the topic"
    said = [
        f"{n.address or '?'}: "
        + (f"holds {sum(s.count for s in n.spans)} of them" if n.answered else "no answer")
        for n in others
    ]
    return f"its {len(others)} neighbour(s): " + ", ".join(said)


def _driver(deployment: Deployment) -> tuple[str, ...]:
    return (deployment.driver_address,) if deployment.driver_address else ()


def write_rows(
    batches: Iterator[Any],
    *,
    client: Any,
    deployment: Deployment,
    options: SinkOptions,
    columns: Columns,
    stream: bytes,
    bases: dict[str, tuple[int, int]],
) -> tuple[_PartitionWriter, dict[str, tuple[int, int, int, int]]]:
    """Publish a partition's rows, Arrow batch by Arrow batch (see the module doc); the
    writer, and per topic written (first place, places, first row, rows)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    writer = _PartitionWriter(client, deployment, options, stream, bases)
    allowed = set(options.topics)
    default_topic = options.topics[0]
    for batch in batches:
        if batch.num_rows == 0:
            continue
        named = {"value": batch.column(columns.value)}
        if columns.key is not None:
            named["key"] = batch.column(columns.key)
        if columns.headers is not None:
            named["headers"] = batch.column(columns.headers)
        rows = pa.RecordBatch.from_arrays(list(named.values()), names=list(named))
        if rows.column("value").null_count:
            raise ValueError("a row's 'value' is null: every published message needs one")
        if columns.topic is None:
            writer.add(default_topic, rows)
            continue
        topics = pc.fill_null(batch.column(columns.topic), default_topic)
        found = pc.unique(topics).to_pylist()
        for topic in found:
            if topic not in allowed:
                raise ValueError(
                    f"a row's topic {topic!r} is not among the sink's topics "
                    f'({", ".join(options.topics)}); list every topic in option "topic"'
                )
        if len(found) == 1:
            writer.add(found[0], rows)
            continue
        for topic in found:  # each topic's rows in their order
            writer.add(topic, rows.filter(pc.equal(topics, topic)))
    return writer, writer.finish()


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def _short(query_id: str) -> str:
    """16 hex digits of the query id (64 bits): keeps a place's name within the 64 bytes a
    publisher may have, and apart from other queries'."""
    return query_id.replace("-", "")[:16]


# -- the sink index: where a batch's rows start -----------------------------------------------


@dataclass(frozen=True)
class IndexFound:
    """Where the last sink index before a batch is: its batch, and nodes that hold it."""

    batch: int
    holders: tuple[bytes, ...]


def find_index(
    client: Any, deployment: Deployment, topic: str, query: str, batch: int
) -> IndexFound | None:
    """The last sink index before `batch` that is held (None: none is, so `batch` starts
    a generation). The driver's node is asked by address as well as the neighbours: it
    published every index of this run."""
    if batch <= 0:
        return None
    control = SINK_INDEX_PREFIX + query.encode()
    asked = HeldSpan(publisher=control, first_seq=0, last_seq=batch - 1)
    nodes = client.holdings(
        topic, spans=[asked], neighbors=True, addresses=_driver(deployment), timeout=ASK_TIMEOUT
    )
    if deployment.driver_address and not any(
        n.answered and n.address == deployment.driver_address for n in nodes
    ):
        raise RuntimeError(
            f"the driver's episub node ({deployment.driver_address}) did not answer where "
            f"batch {batch}'s rows go; the task fails so that Spark tries it again"
        )
    found = [(s.last_seq, n.node_id) for n in nodes if n.answered for s in n.spans]
    if not found:
        return None
    last = max(seq for seq, _ in found)
    return IndexFound(last, tuple(node for seq, node in found if seq == last and node))


def read_index(client: Any, topic: str, query: str, found: IndexFound) -> SinkIndex:
    control = SINK_INDEX_PREFIX + query.encode()
    held = client.read_range(
        topic, control, found.batch, found.batch, fetch_timeout=ASK_TIMEOUT * 2,
        holders=found.holders,
    )  # fmt: skip
    if not held:
        raise RuntimeError(
            f"the sink index of batch {found.batch} is held by {len(found.holders)} node(s) but "
            "could not be read; this fails so that Spark tries again"
        )
    return SinkIndex.from_json(held[0].value)


class EpisubStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions, deployment: Deployment, columns: Columns) -> None:
        self.options = options
        self.deployment = deployment
        self.columns = columns

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        from pyspark import TaskContext

        context = TaskContext.get()
        query = context.getLocalProperty(QUERY_ID_PROPERTY) if context else None
        batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        if query is None or batch is None:
            raise RuntimeError(
                "the episub stream writer runs without Spark's query and batch ids "
                f"({QUERY_ID_PROPERTY}, {BATCH_ID_PROPERTY}); it must run in a streaming query"
            )
        short, batch_id, partition = _short(query), int(batch), _partition_id()
        with shared_executor_client(self.deployment) as client:
            first = self.options.topics[0]
            client.join(first, self.deployment.joins())
            found = find_index(client, self.deployment, first, short, batch_id)
            index = read_index(client, first, short, found) if found is not None else None
            generation = index.generation if index is not None else batch_id
            ends = index.ends if index is not None else {}
            rows = index.rows if index is not None else {}
            bases = {
                t: (per.get(partition, 0), rows.get(t, {}).get(partition, 0))
                for t, per in ends.items()
            }
            writer, written = write_rows(
                iterator,
                client=client,
                deployment=self.deployment,
                options=self.options,
                columns=self.columns,
                stream=sink_stream(short, generation, partition),
                bases=bases,
            )
            address = client.inspect().address
        return SinkCommit(
            partition=partition,
            published=writer.published,
            duplicates=writer.duplicates,
            query=short,
            batch=batch_id,
            generation=generation,
            written=written,
            index=found,
            node=address,
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Publish the sink index of batch `batchId` (where each stream ends now), through the
        driver's node, in every topic of the sink."""
        done = [m for m in messages if isinstance(m, SinkCommit)]
        log.info(
            "batch %d: %d record batches published, %d already published before (retries)",
            batchId,
            sum(m.published for m in done),
            sum(m.duplicates for m in done),
        )
        if not done:
            return  # no task ran: nothing moved, the last index stands
        starts = {(m.generation, m.index.batch if m.index else -1) for m in done}
        if len(starts) != 1:
            raise RuntimeError(
                f"batch {batchId}'s tasks did not all find the same sink index "
                f"(generation, index batch: {sorted(starts)}); the batch fails so that Spark "
                "runs it again"
            )
        query, generation, found = done[0].query, done[0].generation, done[0].index
        # Through the tasks' nodes too: a driver's node that restarted is in no overlay yet.
        joins = tuple(dict.fromkeys([*self.deployment.contacts, *(m.node for m in done if m.node)]))
        with driver_client(self.deployment) as client:
            first = self.options.topics[0]
            join_through(client, first, joins, history=True)
            ends: dict[str, dict[int, int]] = {}
            row_ends: dict[str, dict[int, int]] = {}
            if found is not None:
                holders = tuple(dict.fromkeys(h for m in done if m.index for h in m.index.holders))
                previous = read_index(client, first, query, IndexFound(found.batch, holders))
                ends = {t: dict(per) for t, per in previous.ends.items()}
                row_ends = {t: dict(per) for t, per in previous.rows.items()}
            for m in done:
                for topic, (base, places, base_row, rows) in m.written.items():
                    ends.setdefault(topic, {})[m.partition] = base + places
                    row_ends.setdefault(topic, {})[m.partition] = base_row + rows
            index = SinkIndex(batchId, generation, ends, row_ends)
            control = SINK_INDEX_PREFIX + query.encode()
            for topic in self.options.topics:
                join_through(client, topic, joins, history=True)
                # Stamp 0: a commit run again after a restart writes the very same message.
                client.publish(topic, index.to_json(), stream=(control, batchId), timestamp_ms=0)
                span = HeldSpan(publisher=control, first_seq=batchId, last_seq=batchId)
                await_acks(client, topic, span, self.options.acks, self.options.ack_timeout)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # What was published stays published: a re-run of the batch names the same places,
        # so subscribers get each row once all the same.
        log.warning("batch %d aborted; its re-run will not publish a row twice", batchId)


class EpisubBatchWriter(DataSourceArrowWriter):
    """`df.write.format("episub")`: one write's rows, once each across task retries."""

    def __init__(self, options: SinkOptions, deployment: Deployment, columns: Columns) -> None:
        self.options = options
        self.deployment = deployment
        self.columns = columns
        self.write_id = uuid.uuid4().hex[:16]  # drawn on the driver, pickled to every task

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        partition = _partition_id()
        with shared_executor_client(self.deployment) as client:
            writer, written = write_rows(
                iterator,
                client=client,
                deployment=self.deployment,
                options=self.options,
                columns=self.columns,
                stream=sink_stream(self.write_id, 0, partition),
                bases={},
            )
            address = client.inspect().address
        return SinkCommit(
            partition=partition,
            published=writer.published,
            duplicates=writer.duplicates,
            written=written,
            node=address,
        )
