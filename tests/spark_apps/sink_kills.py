"""Executors SIGKILLed while the episub sink writes, on local-cluster[2,1,1024]: run by
tests/test_spark_kills.py as its own OS process; prints its findings as JSON on stdout's
last line.

1. Mid-sink-task: a streaming query writes 20,000 rows from parquet through the sink; once
   the sink has taken 3,000 rows of partition 0's first attempt, that attempt SIGKILLs its
   own executor (the JVM and the agent with its node, as a machine failing would). Spark
   runs the task again elsewhere, which finds the places the first attempt wrote. Then a
   source query reads the topic back, and every node's copy of every place is compared:
   each place must hold the same message (id) on every node that holds it.
2. Right after a task's commit, with acks=1: a batch write of 10,000 rows whose driver-side
   commit (Spark has every task's result by then) SIGKILLs the executor that wrote
   partition 0, after checking that another node holds all its rows. A batch read of the
   topic afterwards must find every row.

    sink_kills.py WORK_DIR
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession

import spark_connector
from episub.agent import AgentClient
from episub.proto.messages import HeldSpan
from episub.recordbatch import RecordBatch
from spark_connector.datasource import EpisubDataSource
from spark_connector.deployment import (
    agent_dir,
    driver_client,
    executor_client,
    executor_jvm_pid,
    executor_socket_path,
)
from spark_connector.sink import EpisubBatchWriter, EpisubStreamWriter, SinkCommit, await_acks

KEY = bytes(range(32))
ROWS = 20_000
AFTER_COMMIT_ROWS = 10_000
KILL_AT = 3_000
LIMIT = 300.0  # s: the longest any awaited condition may take on a loaded 2-core machine


def kill_executor(agent_dir: str, deployment: Any) -> str:
    """SIGKILL this worker's executor: its JVM and its agent (the node), as a machine
    failing would. Returns what was killed."""
    jvm = executor_jvm_pid()
    assert jvm is not None
    with AgentClient(executor_socket_path(agent_dir, jvm, deployment.executor_name())) as client:
        agent = client.inspect().pid
    os.kill(agent, signal.SIGKILL)
    os.kill(jvm, signal.SIGKILL)
    return f"killed executor {jvm} and its agent {agent}"


class KillMidTask(EpisubStreamWriter):
    """Writes as the sink does, but partition 0's first attempt SIGKILLs its executor once
    the sink has taken KILL_AT of its rows (those before are published), leaving `marker`."""

    marker = ""  # a file: what the kill killed
    first_places = ""  # a file: the first attempt's places (JSON), held by another node
    topic = ""

    def write(self, iterator: Iterator[Any]) -> Any:
        from pyspark import TaskContext

        context = TaskContext.get()
        first = context is not None and (context.partitionId(), context.attemptNumber()) == (0, 0)

        def batches() -> Iterator[Any]:
            taken = 0
            for batch in iterator:  # Arrow record batches
                if first and taken < KILL_AT <= taken + batch.num_rows:
                    yield batch.slice(0, KILL_AT - taken)  # published: KILL_AT / batchSize places
                    if not os.path.exists(self.marker):
                        Path(self.marker).write_text("killing")  # before: the kill ends us
                        Path(self.first_places).write_text(json.dumps(self.held_elsewhere()))
                        Path(self.marker).write_text(kill_executor(agent_dir(), self.deployment))
                        time.sleep(60)  # the worker goes with its executor
                    batch = batch.slice(KILL_AT - taken)
                    taken = KILL_AT
                taken += batch.num_rows
                yield batch

        return super().write(batches())

    def held_elsewhere(self) -> dict[str, str]:
        """Partition 0's places this node holds ({"stream:seq": message id}), once another
        node holds them too: the kill must not take the first attempt's rows with it, or
        its retry would meet nothing."""
        with executor_client(self.deployment) as client:
            spans = {
                publisher: span
                for publisher, span in client.offsets(self.topic).items()
                if publisher.startswith(b"sink/") and publisher.endswith(b"/0")
            }
            places = {}
            for publisher, span in spans.items():
                await_acks(
                    client,
                    self.topic,
                    HeldSpan(publisher=publisher, first_seq=span.first, last_seq=span.last),
                    "1",
                    LIMIT,
                )
                for m in client.read_range(self.topic, publisher, span.first, span.last):
                    places[f"{publisher.decode()}:{m.seq}"] = m.id.hex()
        return places


def node_places(client: AgentClient, topic: str) -> tuple[int, dict[str, str]]:
    """(agent pid, {"stream:seq": message id}) of every sink place the node holds, and
    under "republished" how many of its publishes found their place taken or took one
    from another message or lost one to it (the winner rule)."""
    out = {}
    for publisher, span in client.offsets(topic).items():
        if publisher.startswith(b"sink/"):
            for m in client.read_range(topic, publisher, span.first, span.last):
                out[f"{publisher.decode()}:{m.seq}"] = m.id.hex()
                out[f"rows {publisher.decode()}:{m.seq}"] = str(RecordBatch.decode(m.value).rows)
    status = client.inspect()
    met = ("republished", "rivals_won", "rivals_refused")
    out["republished"] = str(sum(status.stats.get(name, 0) for name in met))
    return status.pid, out


def every_node_places(spark: SparkSession, deployment: Any, topic: str) -> list[dict[str, str]]:
    """The places of the driver's node and of every executor's node (tasks spread wide)."""

    def dump(_: Any) -> Any:
        with executor_client(deployment) as client:
            yield node_places(client, topic)

    with driver_client(deployment) as client:
        views = {0: node_places(client, topic)[1]}
    for _ in range(3):  # Spark places tasks where it likes: a few rounds reach each executor
        for pid, places in (
            spark.sparkContext.parallelize(range(8), 8).mapPartitions(dump).collect()
        ):
            views[pid] = places
    return list(views.values())


def mid_task(spark: SparkSession, deployment: Any, work: Path) -> dict[str, Any]:
    topic = "sunk"
    source = work / "rows"
    spark.createDataFrame([(b"%d" % i,) for i in range(ROWS)], "value binary").repartition(
        2
    ).write.parquet(str(source))
    marker = str(work / "killed")
    first_places = str(work / "first-attempt-places.json")

    class MidTaskSource(EpisubDataSource):
        @classmethod
        def name(cls) -> str:
            return "episub_kill_mid_task"

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            real = super().streamWriter(schema, overwrite)
            killer = KillMidTask(real.options, real.deployment, real.columns)
            killer.marker = marker
            killer.first_places = first_places
            killer.topic = topic
            return killer

    MidTaskSource.deployment = deployment  # type: ignore[misc]
    spark.dataSource.register(MidTaskSource)
    writer = (
        spark.readStream.schema("value binary")
        .parquet(str(source))
        .writeStream.format("episub_kill_mid_task")
        .option("topic", topic)
        .option("batchSize", "100")
        .option("checkpointLocation", str(work / "sink-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert writer.awaitTermination(LIMIT) and writer.exception() is None, writer.exception()
    reader = (
        spark.readStream.format("episub")
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("memory")
        .queryName("sunk_rows")
        .trigger(availableNow=True)
        .start()
    )
    assert reader.awaitTermination(LIMIT) and reader.exception() is None, reader.exception()
    values = [bytes(r.value) for r in spark.sql("select value from sunk_rows").collect()]
    views = every_node_places(spark, deployment, topic)
    republished = sum(int(places.pop("republished")) for places in views)
    ids: dict[str, set[str]] = {}
    rows_at: dict[str, int] = {}
    for places in views:
        for place, message in places.items():
            if place.startswith("rows "):
                rows_at[place] = int(message)
            else:
                ids.setdefault(place, set()).add(message)
    first = json.loads(Path(first_places).read_text()) if os.path.exists(first_places) else {}
    return {
        "killed": Path(marker).read_text() if os.path.exists(marker) else None,
        "first_attempt_places": len(first),
        # The retry met places another node held: each keeps the first attempt's message.
        "first_attempt_places_kept": sum(1 for p, m in first.items() if ids.get(p) == {m}),
        "rows_read": len(values),
        "distinct_read": len(set(values)),
        "exact": sorted(values) == sorted(b"%d" % i for i in range(ROWS)),
        "nodes": len(views),
        "places": len(ids),
        "rows_at_places": sum(rows_at.values()),
        "places_with_two_messages": sum(1 for found in ids.values() if len(found) > 1),
        "republished": republished,
    }


class KillAfterCommit(EpisubBatchWriter):
    """Writes as the sink does; its driver-side commit, when Spark has every task's result,
    SIGKILLs the executor (JVM and agent) that wrote partition 0, after noting whether
    another node (the driver's) held all of that task's rows, in `report_path`."""

    report_path = ""

    def commit(self, messages: list[Any]) -> None:
        done = [m for m in messages if isinstance(m, SinkCommit) and m.partition == 0]
        report: dict[str, Any] = {"partition_0_rows": 0}
        for m in done:
            ((topic, (base, places, _, rows)),) = m.written.items()
            stream = f"sink/{self.write_id}/0/0".encode()
            span = HeldSpan(publisher=stream, first_seq=base, last_seq=base + places - 1)
            with driver_client(self.deployment) as client:
                (mine,) = client.holdings(topic, spans=[span])
            report["partition_0_rows"] = rows
            report["partition_0_places"] = places
            report["driver_held_before_kill"] = sum(s.count for s in mine.spans)
            victim = agent_at(agent_dir(), m.node)  # local-cluster: executors share this host
            report["victim"] = victim
            if victim is not None:
                os.kill(victim[0], signal.SIGKILL)
                os.kill(victim[1], signal.SIGKILL)
        Path(self.report_path).write_text(json.dumps(report))


def agent_at(directory: str, address: str) -> tuple[int, int] | None:
    """(agent pid, executor JVM pid) of the executor agent listening at `address`."""
    for path in Path(directory).glob("exec-*.sock"):
        try:
            with AgentClient(str(path), timeout=5) as client:
                status = client.inspect()
        except OSError:
            continue
        if status.address == address:
            return status.pid, int(path.name.split("-")[1])
    return None


def after_commit(spark: SparkSession, deployment: Any, work: Path) -> dict[str, Any]:
    topic = "acked"

    report_path = work / "after-commit.json"

    class AfterCommitSource(EpisubDataSource):
        @classmethod
        def name(cls) -> str:
            return "episub_kill_after_commit"

        def writer(self, schema: Any, overwrite: bool) -> Any:
            real = super().writer(schema, overwrite)
            killer = KillAfterCommit(real.options, real.deployment, real.columns)
            killer.report_path = str(report_path)
            return killer

    AfterCommitSource.deployment = deployment  # type: ignore[misc]
    spark.dataSource.register(AfterCommitSource)
    frame = spark.createDataFrame(
        [(b"%d" % i,) for i in range(AFTER_COMMIT_ROWS)], "value binary"
    ).repartition(2)
    frame.write.format("episub_kill_after_commit").option("topic", topic).option("acks", "1").mode(
        "append"
    ).save()
    report = json.loads(report_path.read_text())
    victim = report.get("victim")
    deadline = time.monotonic() + LIMIT
    while victim and any(os.path.exists(f"/proc/{pid}") for pid in victim):
        if time.monotonic() > deadline:
            raise SystemExit(f"the killed executor {victim} is still there")
        time.sleep(0.1)  # polling another process's end: there is no event to await
    back = spark.read.format("episub").option("topic", topic).load()
    values = sorted(bytes(r.value) for r in back.collect())
    report["rows_read"] = len(values)
    report["exact"] = values == sorted(b"%d" % i for i in range(AFTER_COMMIT_ROWS))
    return report


def main() -> None:
    work = Path(sys.argv[1])
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .config("spark.ui.enabled", "false")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.task.maxFailures", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        deployment = spark_connector.register(spark, key=KEY)
        found = {"mid_task": mid_task(spark, deployment, work)}
        found["after_commit"] = after_commit(spark, deployment, work)
        print(json.dumps(found), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
