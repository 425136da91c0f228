"""Topics as a Structured Streaming sink: `df.writeStream.format("episub")`.

Columns: `value` (binary or string, required), `key` (binary or string), `headers`
(array of struct<key: string, value: binary>, Kafka's shape, or map<string, binary>), and
`topic` (string: the row's topic instead of the `topic` option's first). Each task
publishes through its own executor's node.

Exactly once toward subscribers. A row's identity does not depend on which executor or
which attempt writes it: each task publishes its rows at named places of a stream of its
own, `sink/<query>/<batch>/<partition>`, numbered 0, 1, 2... per topic in the order the
partition yields them (episub.Node.publish_record's `stream`). A retried task, or a re-run
micro-batch, names the same places again, and a place that is taken publishes nothing on
any node that has heard of it. The query and batch come from Spark's task-local properties
(`sql.streaming.queryId`, `streaming.sql.batchId`); a batch (non-streaming) write uses an
id drawn once when its writer is made on the driver, which covers its task retries.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    MapType,
    StringType,
    StructType,
)

from spark_connector.deployment import Deployment, executor_client
from spark_connector.options import OptionError, SinkOptions

__all__ = ["EpisubBatchWriter", "EpisubStreamWriter", "SinkCommit", "check_sink_schema"]

log = logging.getLogger("spark_connector.sink")

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # StreamExecution.QUERY_ID_KEY
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # MicroBatchExecution.BATCH_ID_KEY
_TEXT_OR_BINARY = (StringType, BinaryType)


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task did: rows published, and rows whose place was taken already."""

    partition: int
    published: int
    duplicates: int


def check_sink_schema(schema: StructType, options: SinkOptions) -> None:
    """Refuse a DataFrame the sink cannot write, naming the column and what it must be."""
    fields = {f.name.lower(): f for f in schema.fields}
    value = fields.get("value")
    if value is None:
        raise OptionError(
            f"the episub sink needs a 'value' column (binary or string); the DataFrame has "
            f"{', '.join(schema.fieldNames()) or 'no columns'}"
        )
    for name in ("value", "key", "topic"):
        field = fields.get(name)
        allowed = (StringType,) if name == "topic" else _TEXT_OR_BINARY
        if field is not None and not isinstance(field.dataType, allowed):
            kinds = " or ".join(t.typeName() for t in allowed)
            raise OptionError(
                f"column {field.name!r} must be {kinds}, not {field.dataType.simpleString()}"
            )
    headers = fields.get("headers")
    if headers is not None and not _headers_type(headers.dataType):
        raise OptionError(
            "column 'headers' must be array<struct<key:string,value:binary>> or "
            f"map<string,binary>, not {headers.dataType.simpleString()}"
        )
    if "topic" not in fields and not options.topics:
        raise OptionError(
            'the episub sink needs option "topic", or a "topic" column naming each row\'s topic'
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


def _bytes(value: object, column: str) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"column {column!r} holds {type(value).__name__}, not binary or string")


def _row_headers(headers: object) -> tuple[tuple[str, bytes], ...]:
    if headers is None:
        return ()
    pairs = headers.items() if isinstance(headers, dict) else headers
    return tuple((str(k), _bytes(v, "headers")) for k, v in pairs)  # type: ignore[union-attr]


def write_partition(
    rows: Iterator[object],
    *,
    deployment: Deployment,
    options: SinkOptions,
    stream_prefix: str,
) -> SinkCommit:
    """Publish a partition's rows at the places `stream_prefix/<partition>`, seq per topic."""
    from pyspark import TaskContext

    from episub.agent import Record

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    stream = f"{stream_prefix}/{partition}".encode()
    allowed = set(options.topics)
    default_topic = options.topics[0] if options.topics else None
    published = duplicates = 0
    with executor_client(deployment) as client:
        joined: set[str] = set()
        seqs: dict[str, int] = {}
        pending: dict[str, list[Record]] = {}

        def flush(topic: str) -> None:
            nonlocal published, duplicates
            records = pending.pop(topic, [])
            if records:
                for receipt in client.publish_batch(topic, records):
                    if receipt.duplicate:
                        duplicates += 1
                    else:
                        published += 1

        for row in rows:
            fields = row.asDict() if hasattr(row, "asDict") else dict(row)  # type: ignore[call-overload]
            topic = fields.get("topic") or default_topic
            if topic is None:
                raise ValueError("a row has no topic: its 'topic' is null and no option names one")
            if allowed and topic not in allowed:
                raise ValueError(
                    f"a row's topic {topic!r} is not among the sink's topics "
                    f'({", ".join(options.topics)}); list every topic in option "topic"'
                )
            if topic not in joined:
                client.join(topic)
                joined.add(topic)
            value = fields.get("value")
            if value is None:
                raise ValueError("a row's 'value' is null: every published message needs one")
            key = fields.get("key")
            seq = seqs.get(topic, 0)
            seqs[topic] = seq + 1
            pending.setdefault(topic, []).append(
                Record(
                    value=_bytes(value, "value"),
                    key=None if key is None else _bytes(key, "key"),
                    headers=_row_headers(fields.get("headers")),
                    stream=(stream, seq),
                )
            )
            if len(pending[topic]) >= options.batch_size:
                flush(topic)
        for topic in list(pending):
            flush(topic)
    return SinkCommit(partition=partition, published=published, duplicates=duplicates)


def _short(query_id: str) -> str:
    """16 hex digits of the query id (64 bits): keeps a place's name within the 64 bytes a
    publisher may have, and apart from other queries'."""
    return query_id.replace("-", "")[:16]


class EpisubStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: SinkOptions, deployment: Deployment) -> None:
        self.options = options
        self.deployment = deployment

    def write(self, iterator: Iterator[object]) -> SinkCommit:
        from pyspark import TaskContext

        context = TaskContext.get()
        query = context.getLocalProperty(QUERY_ID_PROPERTY) if context else None
        batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        if query is None or batch is None:
            raise RuntimeError(
                "the episub stream writer runs without Spark's query and batch ids "
                f"({QUERY_ID_PROPERTY}, {BATCH_ID_PROPERTY}); it must run in a streaming query"
            )
        return write_partition(
            iterator,
            deployment=self.deployment,
            options=self.options,
            stream_prefix=f"sink/{_short(query)}/{int(batch)}",
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, SinkCommit)]
        log.info(
            "batch %d: %d rows published, %d already published before (retried tasks)",
            batchId,
            sum(m.published for m in done),
            sum(m.duplicates for m in done),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # What was published stays published: a re-run of the batch names the same places,
        # so subscribers get each row once all the same.
        log.warning("batch %d aborted; its re-run will not publish a row twice", batchId)


class EpisubBatchWriter(DataSourceWriter):
    """`df.write.format("episub")`: one write's rows, once each across task retries."""

    def __init__(self, options: SinkOptions, deployment: Deployment) -> None:
        self.options = options
        self.deployment = deployment
        self.write_id = uuid.uuid4().hex[:16]  # drawn on the driver, pickled to every task

    def write(self, iterator: Iterator[object]) -> SinkCommit:
        return write_partition(
            iterator,
            deployment=self.deployment,
            options=self.options,
            stream_prefix=f"sink/{self.write_id}/0",
        )
