"""The episub source and sink in real Spark (local[2], up to 4 attempts per task), with real
agent processes and an external `episub` command on loopback. One SparkSession for the
module (a JVM start costs seconds); every agent started here is stopped by its pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark connector needs the spark extra")

from pyspark.sql import SparkSession
from pyspark.sql.functions import col, udf
from pyspark.sql.types import BinaryType

import spark_connector
from episub.agent import AgentClient

pytestmark = [pytest.mark.timeout(300), pytest.mark.spark]

KEY = bytes(range(32))
LIMIT = 120.0  # s: the longest any awaited condition may take on a loaded 2-core machine


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2,4]")  # 4 attempts per task: retries happen
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def deployment(spark: SparkSession) -> Iterator[spark_connector.Deployment]:
    deployment = spark_connector.register(spark, key=KEY)
    yield deployment
    with AgentClient(deployment.driver_socket) as client:
        pid = client.inspect().pid
    os.kill(pid, signal.SIGTERM)  # the driver agent's owner (pytest) lives on


def driver(deployment: spark_connector.Deployment) -> AgentClient:
    return AgentClient(deployment.driver_socket)


def episub_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "episub.cli", *args]


def command_env() -> dict[str, str]:
    return {**os.environ, "EPISUB_KEY": KEY.hex()}


def rows_of(spark: SparkSession, path: Path) -> list[tuple[str, int, bytes]]:
    if not any(path.glob("*.parquet")):
        return []
    frame = spark.read.parquet(str(path))
    return [(r.publisher, r.seq, bytes(r.value)) for r in frame.collect()]


def wait_for(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + LIMIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)  # each look runs a Spark job or a query step: no event to await


def test_rows_published_by_the_episub_command_reach_a_file_sink_exactly_once(
    spark: SparkSession, deployment: spark_connector.Deployment, tmp_path: Path
) -> None:
    topic = "cli-events"
    with driver(deployment) as client:
        client.join(topic)
    query = (
        spark.readStream.format("episub")
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        publish = subprocess.run(
            episub_command(
                "publish", "--bootstrap", deployment.bootstrap[0], "--topic", topic,
                "--count", "5000", "--size", "64", "--summary",
            ),
            env=command_env(), capture_output=True, text=True, timeout=LIMIT, check=False,
        )  # fmt: skip
        assert publish.returncode == 0, publish.stderr

        def all_arrived() -> bool:
            query.processAllAvailable()
            return len(rows_of(spark, tmp_path / "out")) >= 5000

        wait_for(all_arrived, "5,000 rows in the file sink")
    finally:
        query.stop()
    rows = rows_of(spark, tmp_path / "out")
    assert len(rows) == 5000
    publishers = {p for p, _, _ in rows}
    assert len(publishers) == 1
    assert sorted(seq for _, seq, _ in rows) == list(range(5000))


def test_max_rows_per_trigger_bounds_every_batch_and_available_now_drains_then_stops(
    spark: SparkSession, deployment: spark_connector.Deployment, tmp_path: Path
) -> None:
    topic = "bounded"
    with driver(deployment) as client:
        client.join(topic)
        client.publish_batch(topic, [b"m%d" % i for i in range(250)])
    query = (
        spark.readStream.format("episub")
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxRowsPerTrigger", "40")
        .load()
        .writeStream.format("memory")
        .queryName("bounded_rows")
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(LIMIT), "AvailableNow did not stop"
    assert query.exception() is None
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes and max(sizes) <= 40, sizes
    assert sum(sizes) == 250
    values = sorted(r.value for r in spark.sql("select value from bounded_rows").collect())
    assert values == sorted(b"m%d" % i for i in range(250))


def test_rows_no_reachable_node_holds_fail_the_query_or_are_skipped_with_their_count(
    spark: SparkSession, deployment: spark_connector.Deployment, tmp_path: Path
) -> None:
    """An outside node that keeps only its last 5 messages published 10 before the
    application's nodes joined: seqs 0..4 are held by nobody reachable. The query is
    started at seq 0 of that publisher."""
    topic = "lossy"
    config = tmp_path / "retention.json"
    config.write_text(json.dumps({"retention": {"max_messages": 5}}))
    socket_path = str(tmp_path / "outsider.sock")
    outsider = subprocess.Popen(
        episub_command(
            "node", "--listen", "127.0.0.1:0", "--topic", topic, "--socket", socket_path,
            "--config", str(config),
        ),
        env=command_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: Path(socket_path).exists(), "the outsider's socket")
        with AgentClient(socket_path) as outside:
            early = outside.publish_batch(topic, [b"before %d" % i for i in range(10)])
            publisher = early[0].publisher
            address = outside.inspect().address

        def start(name: str, fail: bool):  # type: ignore[no-untyped-def]
            return (
                spark.readStream.format("episub")
                .option("topic", topic)
                .option("bootstrap", address)
                .option("startingOffsets", json.dumps({topic: {publisher.decode("latin-1"): 0}}))
                .option("failOnDataLoss", str(fail).lower())
                .load()
                .writeStream.format("memory")
                .queryName(name)
                .trigger(availableNow=True)
                .start()
            )

        failing = start("lossy_failing", True)
        with pytest.raises(Exception, match=r"seqs 0\.\.4 \(5 rows\) are held by no reachable"):
            failing.awaitTermination(LIMIT)
        skipping = start("lossy_skipping", False)
        assert skipping.awaitTermination(LIMIT) and skipping.exception() is None
        rows = spark.sql("select seq, value from lossy_skipping").collect()
        assert sorted(r.seq for r in rows) == [5, 6, 7, 8, 9]
        # The warning and its count: tests/test_spark_planner.py (the planner's worker logs
        # to a stderr Spark forwards in its own time).
    finally:
        outsider.send_signal(signal.SIGTERM)
        outsider.wait(timeout=30)


def test_a_restarted_query_resumes_from_its_checkpoint_without_gap_or_duplicate(
    spark: SparkSession, deployment: spark_connector.Deployment, tmp_path: Path
) -> None:
    topic = "restart"
    total = 3000
    with driver(deployment) as client:
        client.join(topic)

    def publish() -> None:
        with driver(deployment) as client:
            for chunk in range(30):
                client.publish_batch(topic, [b"%d" % (chunk * 100 + i) for i in range(100)])
                time.sleep(0.05)  # paced: publishing goes on across the restart

    def start():  # type: ignore[no-untyped-def]
        return (
            spark.readStream.format("episub")
            .option("topic", topic)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    publisher = threading.Thread(target=publish)
    first = start()
    publisher.start()
    try:
        wait_for(lambda: len(first.recentProgress) >= 3, "a few batches")
    finally:
        first.stop()
    second = start()
    try:
        publisher.join(LIMIT)

        def complete() -> bool:
            second.processAllAvailable()
            return len(rows_of(spark, tmp_path / "out")) >= total

        wait_for(complete, "every published row")
    finally:
        second.stop()
    rows = rows_of(spark, tmp_path / "out")
    assert len(rows) == total, f"{len(rows)} rows for {total} published"
    assert sorted(int(v) for _, _, v in rows) == list(range(total))


_ROWS_SEEN: dict[tuple[int, int, int], int] = {}  # rows per task attempt, in a UDF worker


def fail_first_attempt(marker: Path):  # type: ignore[no-untyped-def]
    """A UDF that fails partition 0's first attempt mid-way, leaving `marker` behind as
    proof that it did."""

    @udf(returnType=BinaryType())
    def passthrough(value: bytes) -> bytes:
        from pyspark import TaskContext

        context = TaskContext.get()
        attempt = (context.stageId(), context.partitionId(), context.attemptNumber())
        _ROWS_SEEN[attempt] = _ROWS_SEEN.get(attempt, 0) + 1
        if attempt[1:] == (0, 0) and _ROWS_SEEN[attempt] == 2000:
            marker.write_text(f"stage {context.stageId()} attempt 0 failed")
            raise RuntimeError("failing the first attempt on purpose")
        return value

    return passthrough


def test_the_sink_delivers_every_row_once_even_when_a_task_is_retried(
    spark: SparkSession, deployment: spark_connector.Deployment, tmp_path: Path
) -> None:
    topic = "sunk"
    total = 10_000
    failed = tmp_path / "failed-attempt"
    source_dir = tmp_path / "rows"
    spark.createDataFrame([(b"%d" % i,) for i in range(total)], "value binary").repartition(
        2
    ).write.parquet(str(source_dir))
    with driver(deployment) as client:
        client.join(topic)
    subscriber = subprocess.Popen(
        episub_command(
            "subscribe", "--bootstrap", deployment.bootstrap[0], "--topic", topic, "--json",
            "--buffer", "20000",  # it prints slower than a sink publishes: no lag
        ),
        env=command_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[dict] = []
    threading.Thread(
        target=lambda: lines.extend(json.loads(line) for line in subscriber.stdout),  # type: ignore[union-attr]
        daemon=True,
    ).start()
    reader = (
        spark.readStream.format("episub")
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("memory")
        .queryName("sunk_rows")
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        with driver(deployment) as client:

            def subscriber_ready() -> bool:
                client.publish(topic, b"probe")  # until the subscriber prints one
                return bool(lines)

            wait_for(subscriber_ready, "the external subscriber")
        writer = (
            spark.readStream.schema("value binary")
            .parquet(str(source_dir))
            .select(fail_first_attempt(failed)(col("value")).alias("value"))
            .writeStream.format("episub")
            .option("topic", topic)
            .option("batchSize", "100")
            .option("checkpointLocation", str(tmp_path / "writer-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert writer.awaitTermination(LIMIT)
        assert writer.exception() is None

        def subscribed() -> list[dict]:
            return [m for m in list(lines) if m.get("value") != "probe"]

        def read_all() -> bool:
            reader.processAllAvailable()
            count = spark.sql("select count(*) c from sunk_rows where value != 'probe'")
            return count.collect()[0].c >= total

        wait_for(read_all, "the reading query to see every row")
        try:
            wait_for(lambda: len(subscribed()) >= total, "the subscriber to see every row")
        except AssertionError:
            subscriber.kill()
            raise AssertionError(
                f"the subscriber saw {len(subscribed())} of {total}; it said: "
                f"{subscriber.stderr.read()[-2000:]}"  # type: ignore[union-attr]
            ) from None
    finally:
        reader.stop()
        subscriber.kill()
        subscriber.wait()
    expected = sorted(b"%d" % i for i in range(total))
    read = [bytes(r.value) for r in spark.sql("select value from sunk_rows").collect()]
    assert sorted(v for v in read if v != b"probe") == expected
    assert failed.exists(), "the first attempt did not fail"
    seen = subscribed()
    assert sorted(m["value"].encode() for m in seen) == expected
    assert len({(m["publisher"], m["seq"]) for m in seen}) == total


def test_a_rerun_batch_publishes_no_place_twice(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    """A micro-batch re-run after a failure (or a retried task) writes the same rows under
    the same query and batch ids: the stream writer's first run here fails half-way, as a
    failed attempt does, having published the record batches it completed (5 of 100 rows),
    and the rerun publishes only the other half, cutting the rows into the same batches."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from episub.recordbatch import unbatch
    from spark_connector.options import parse_sink
    from spark_connector.sink import (
        BATCH_ID_PROPERTY,
        QUERY_ID_PROPERTY,
        EpisubStreamWriter,
        check_sink_schema,
    )

    topic = "rerun"
    total = 1000
    with driver(deployment) as client:
        client.join(topic)
    options = parse_sink({"topic": topic, "batchSize": "100"})
    schema = StructType([StructField("value", BinaryType())])
    writer = EpisubStreamWriter(options, deployment, check_sink_schema(schema, options))
    context = spark.sparkContext
    context.setLocalProperty(QUERY_ID_PROPERTY, "5eed0000-0000-4000-8000-000000000001")
    context.setLocalProperty(BATCH_ID_PROPERTY, "7")
    try:

        def run(fail_at: int | None) -> list:  # type: ignore[type-arg]
            def write(rows: Iterator) -> list:  # type: ignore[type-arg]
                import pyarrow as pa

                values = [bytes(r.value) for r in rows]

                def batches() -> Iterator[pa.RecordBatch]:
                    for low in range(0, len(values), 250):  # Arrow batches of 250 rows
                        if fail_at is not None and low >= fail_at:
                            raise RuntimeError("the attempt fails")
                        part = pa.array(values[low : low + 250], pa.binary())
                        yield pa.RecordBatch.from_arrays([part], names=["value"])

                try:
                    return [writer.write(batches())]
                except RuntimeError:
                    return ["failed"]

            frame = spark.createDataFrame([(b"%d" % i,) for i in range(total)], "value binary")
            return frame.coalesce(1).rdd.mapPartitions(write).collect()

        assert run(fail_at=total // 2) == ["failed"]
        [rerun] = run(fail_at=None)
    finally:
        context.setLocalProperty(QUERY_ID_PROPERTY, None)  # type: ignore[arg-type]
        context.setLocalProperty(BATCH_ID_PROPERTY, None)  # type: ignore[arg-type]
    assert (rerun.published, rerun.duplicates) == (5, 5)  # places: batches of 100 rows
    stream = b"sink/5eed000000004000/7/0"  # batch 7 found no index: a generation from 7
    with driver(deployment) as client:

        def rerun_held() -> bool:
            span = client.offsets(topic).get(stream)
            return span is not None and span.count == 10

        wait_for(rerun_held, "the rerun")
        held = [row for m in client.read_range(topic, stream, 0, 9) for row in unbatch(m)]
    assert [m.seq for m in held] == list(range(total))  # row offsets, without gaps
    assert [m.value for m in held] == [b"%d" % i for i in range(total)]
