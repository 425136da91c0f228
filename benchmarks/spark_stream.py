"""The episub source end to end on a two-executor Spark cluster, beside Spark's `rate` source.

    .venv/bin/python benchmarks/spark_stream.py --mode paced --rate 1000 --seconds 30 --trigger 1
    .venv/bin/python benchmarks/spark_stream.py --mode burst --messages 100000
    .venv/bin/python benchmarks/spark_stream.py --mode bulk --rows 1000000
    .venv/bin/python benchmarks/spark_stream.py --mode steady --seconds 30

Both sources feed the same sink: a foreachBatch on the driver that collects each batch's
`timestamp` column. A row's latency is the time that collect returned (the row is then
visible to the application) minus its timestamp: the publisher's clock at publish for
episub, the row's generation time for `rate` (both the same host's wall clock). Rows/s is
rows seen over the time from the first to the last batch that had rows.

- paced: one external node process publishes --rate msgs/s for --seconds (100-byte values);
  `rate` runs at the same rowsPerSecond. Latency is the figure to read.
- burst: the publisher publishes --messages as fast as it can; `rate` gets rowsPerSecond
  set high. Rows/s is the figure to read: the engine's ceiling with `rate`, ours with episub.

- bulk: the Arrow data path's throughput. A bulk publisher outside Spark (a client of the
  driver's agent, its own OS process) publishes --rows rows as record batches of 4,096 rows
  on a named stream; then, in one sitting, interleaved: the episub source (a batch read and
  an `availableNow` stream, both into the `noop` sink) beside a trivial in-memory Python
  data source with the same schema and partitioning (tuples, as PySpark's own Python
  source path), and the sink (`df.write` and `writeStream` `availableNow` from parquet) of
  --rows rows of --size bytes. Rows/s = rows / the Spark job's wall time.

- steady: the same bulk publisher publishes record batches of 16,384 rows as fast as it
  can for --seconds while a stream query (default trigger, foreachBatch counting rows)
  reads from the start: the rows/s the query kept up with, and the oldest row's age in
  each micro-batch.

Warm-up is not measured: the first micro-batches of a query start Python workers and the
data source's planners, seconds each. The publisher first sends --warmup messages (at
200/s: ten seconds' worth of batches, so every executor has run tasks), and the
measured phase starts once the query has read them; `rate`'s first WARM_SECONDS of rows
are skipped the same way.

Runs on local-cluster[2,1,1024] (two executors of one core: this machine has two cores,
shared by the publisher, both executors, their agents and the driver). Writes JSON with
the command line to --out (default benchmarks/results/spark_stream_<mode>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import _common

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

KEY = bytes(range(32))
TOPIC = "bench"
LIMIT = 600.0  # s: the longest one run may take
# Rows before measuring: the first micro-batches start Python workers and planners (seconds).
WARM_SECONDS = 10  # `rate`: this many seconds' worth of rows are warm-up

PUBLISHER = r"""
import sys, time, trio
from episub import Node
key, bootstrap, topic = bytes.fromhex(sys.argv[1]), sys.argv[2], sys.argv[3]
count, rate, size = int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
warmup = int(sys.argv[8])

async def main():
    async with Node(key=key, listen="127.0.0.1:0") as node:
        await node.join(topic, bootstrap=[bootstrap])
        print("joined", flush=True)
        for i in range(warmup):
            await node.publish(topic, b"warm-up")
            await trio.sleep(0.005)  # 200/s: several batches, every executor's tasks
        print("warm", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # "go"
        start = time.monotonic()
        for i in range(count):
            if rate > 0:
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    await trio.sleep(delay)
            await node.publish(topic, b"%d " % i + b"x" * max(0, size - 8))
            if i % 1000 == 999:
                await trio.sleep(0)  # let the runtime send
        print("published", count, "in", round(time.monotonic() - start, 3), flush=True)
        await trio.sleep(float(sys.argv[7]))  # stay: late readers may fetch from us

trio.run(main)
"""


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile, q in 0..1; None for no values."""
    return _common.percentile(values, q * 100) if values else None


class BatchLog:
    """What the foreachBatch sink saw: per batch, rows and their visible-minus-stamp.
    Rows with `index_column` below `skip` are warm-up: counted apart, not measured."""

    def __init__(self, index_column: str, skip: int) -> None:
        self.index_column = index_column
        self.skip = skip
        self.warm_rows = 0
        self.started: float | None = None  # when the measured phase began
        self.rows = 0
        self.first: float | None = None
        self.last: float | None = None
        self.latencies_ms: list[float] = []
        self.batches = 0
        self.per_batch: list[dict[str, Any]] = []  # rows, latency max, time since the last
        self.lock = threading.Lock()

    def sink(self, column: str) -> Any:
        def on_batch(batch: Any, batch_id: int) -> None:
            rows = batch.select(column, self.index_column).collect()
            now = time.time()
            stamps = [r[0] for r in rows if r[1] >= self.skip]
            with self.lock:
                self.warm_rows += len(rows) - len(stamps)
                if not stamps:
                    return
                self.batches += 1
                self.per_batch.append(
                    {
                        "id": batch_id,
                        "rows": len(stamps),
                        "since_last_s": round(now - (self.last or now), 2),
                        "latency_max_ms": round((now - min(stamps).timestamp()) * 1000),
                    }
                )
                self.first = self.first or now
                self.last = now
                self.rows += len(stamps)
                self.latencies_ms += [(now - s.timestamp()) * 1000 for s in stamps]

        return on_batch

    def summary(self) -> dict[str, Any]:
        start = self.started if self.started is not None else self.first
        span = (self.last - start) if start and self.last else 0.0
        return {
            "rows": self.rows,
            "warm_up_rows": self.warm_rows,
            "batches": self.batches,
            "rows_per_s": round(self.rows / span, 1) if span > 0 else None,
            "latency_ms_p50": _round(percentile(self.latencies_ms, 0.50)),
            "latency_ms_p99": _round(percentile(self.latencies_ms, 0.99)),
            "latency_ms_mean": _round(statistics.fmean(self.latencies_ms))
            if self.latencies_ms
            else None,
            "per_batch": self.per_batch,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def wait(condition: Any, what: str, limit: float = LIMIT) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)  # polling a query's progress: Spark offers no event to await here


def run_episub(spark: Any, args: argparse.Namespace, deployment: Any) -> dict[str, Any]:
    import spark_connector

    count = args.messages if args.mode == "burst" else int(args.rate * args.seconds)
    rate = 0.0 if args.mode == "burst" else args.rate
    with spark_connector.deployment.driver_client(deployment) as client:
        client.join(TOPIC)
    publisher = subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, KEY.hex(), deployment.bootstrap[0], TOPIC,
         str(count), str(rate), str(args.size), str(LIMIT), str(args.warmup)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    log = BatchLog("seq", args.warmup)
    query = None
    try:
        assert publisher.stdout is not None and publisher.stdin is not None
        assert publisher.stdout.readline().strip() == "joined"
        query = (
            spark.readStream.format("episub")
            .option("topic", TOPIC)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.foreachBatch(log.sink("timestamp"))
        )
        if args.trigger:
            query = query.trigger(processingTime=f"{args.trigger} seconds")
        query = query.start()
        assert publisher.stdout.readline().strip() == "warm"
        wait(lambda: log.warm_rows >= args.warmup, "the warm-up rows")
        log.started = time.time()
        publisher.stdin.write("go\n")
        publisher.stdin.flush()
        wait(lambda: log.rows >= count, f"{count} rows")
        # "published N in S s": how fast the one publisher could go, for the burst figure.
        publish_line = publisher.stdout.readline().split()
        publish_seconds = float(publish_line[-1])
    finally:
        if query is not None:
            query.stop()
        publisher.kill()
        publisher.wait()
    return {
        "published": count,
        "publisher_msgs_per_s": round(count / publish_seconds, 1) if publish_seconds else None,
        **log.summary(),
    }


def run_rate(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    rate = args.rate if args.mode == "paced" else args.burst_rate
    count = int(args.rate * args.seconds) if args.mode == "paced" else args.messages
    warm = int(rate * WARM_SECONDS)
    log = BatchLog("value", warm)
    count += warm
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .option("numPartitions", 2)
        .load()
        .writeStream.foreachBatch(log.sink("timestamp"))
    )
    if args.trigger:
        query = query.trigger(processingTime=f"{args.trigger} seconds")
    query = query.start()
    try:
        wait(lambda: log.rows + log.warm_rows >= count, f"{count} rate rows")
    finally:
        query.stop()
    return {"rows_per_second_option": rate, **log.summary()}


BULK_PUBLISHER = r"""
import sys, time
from episub.agent import AgentClient, Record
from episub.recordbatch import BATCH_HEADER, encode
socket_path, topic, rows, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
per = 4096
stream = b"bench/bulk"
with AgentClient(socket_path, timeout=60) as client:
    client.join(topic)
    start = time.monotonic()
    stamp = int(time.time() * 1000)
    records = []
    place = 0
    for first in range(0, rows, per):
        n = min(per, rows - first)
        batch = [(stamp, None, b"%09d" % (first + i) + b"x" * (size - 9), ()) for i in range(n)]
        records.append(Record(value=encode(first, batch), headers=((BATCH_HEADER, b"1"),),
                              stream=(stream, place), timestamp_ms=stamp))
        place += 1
        if len(records) == 16:
            client.publish_batch(topic, records)
            records = []
    if records:
        client.publish_batch(topic, records)
    print("published", rows, "in", round(time.monotonic() - start, 3), flush=True)
"""


STEADY_PUBLISHER = r"""
import sys, time
from episub.agent import AgentClient
socket_path, topic, seconds, size = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
with AgentClient(socket_path, timeout=60) as client:
    client.join(topic)
    value = b"x" * size
    place = row = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        stamp = int(time.time() * 1000)
        place, row = client.publish_rows(
            topic, b"bench/steady", [(stamp, None, value, ())] * 16384, place=place, first_row=row
        )
    print("published", row, "in", round(time.monotonic() - start, 3), flush=True)
"""


def run_steady(spark: Any, args: argparse.Namespace, deployment: Any) -> dict[str, Any]:
    """A publisher outside Spark publishing record batches as fast as it can for --seconds
    while a stream query (default trigger) reads; rows/s the query kept up with."""
    batches: list[tuple[float, int, float]] = []  # when, rows, oldest row's age (s)

    def on_batch(batch: Any, batch_id: int) -> None:
        row = batch.selectExpr("count(*) c", "min(timestamp) t").collect()[0]
        if row.c:
            now = time.time()
            batches.append((now, row.c, now - row.t.timestamp()))

    topic = "steady"
    with spark_connector_client(deployment) as client:
        client.join(topic)
    query = (
        spark.readStream.format("episub").option("topic", topic)
        .option("startingOffsets", "earliest").load()
        .writeStream.foreachBatch(on_batch).start()
    )  # fmt: skip
    try:
        publisher = subprocess.run(
            [sys.executable, "-c", STEADY_PUBLISHER, deployment.driver_socket, topic,
             str(args.seconds), str(args.size)],
            capture_output=True, text=True, check=True, timeout=LIMIT,
        )  # fmt: skip
        words = publisher.stdout.split()
        published, publish_seconds = int(words[1]), float(words[-1])
        wait(lambda: sum(b[1] for b in batches) >= published, f"{published} steady rows")
    finally:
        query.stop()
    span = batches[-1][0] - batches[0][0] if len(batches) > 1 else 0.0
    read = sum(b[1] for b in batches[1:])  # rows after the first batch, over the span
    return {
        "published": published,
        "publisher_rows_per_s": round(published / publish_seconds),
        "batches": len(batches),
        "query_rows_per_s": round(read / span) if span else None,
        "oldest_row_age_s_max": round(max(b[2] for b in batches), 2),
        "per_batch": [{"rows": b[1], "oldest_age_s": round(b[2], 2)} for b in batches],
    }


def spark_connector_client(deployment: Any) -> Any:
    from spark_connector.deployment import driver_client

    return driver_client(deployment)


def trivial_source(partitions: int, rows: int, size: int, include_headers: bool) -> Any:
    """A Python data source of `rows` in-memory rows with the episub source's schema, in
    `partitions` partitions, yielding tuples (PySpark's own Python source path)."""
    import datetime

    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from spark_connector.datasource import SCHEMA, SCHEMA_NO_HEADERS

    class Part(InputPartition):
        def __init__(self, low: int, high: int) -> None:
            self.low, self.high = low, high

    class Reader(DataSourceReader):
        def partitions(self) -> list[Any]:
            step = -(-rows // partitions)
            return [Part(i, min(rows, i + step)) for i in range(0, rows, step)]

        def read(self, partition: Any) -> Any:
            stamp = datetime.datetime.now(tz=datetime.UTC)
            value = b"x" * size
            for i in range(partition.low, partition.high):
                row = ("bench", "bench/bulk", i, stamp, None, value)
                yield (*row, []) if include_headers else row

    class Trivial(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_trivial"

        def schema(self) -> str:
            return SCHEMA if include_headers else SCHEMA_NO_HEADERS

        def reader(self, schema: Any) -> Any:
            return Reader()

    return Trivial


def timed(what: str, action: Any, rows: int) -> dict[str, Any]:
    start = time.monotonic()
    action()
    seconds = time.monotonic() - start
    print(f"{what}: {rows} rows in {seconds:.2f} s = {rows / seconds:,.0f} rows/s", flush=True)
    return {"rows": rows, "seconds": round(seconds, 3), "rows_per_s": round(rows / seconds)}


def run_bulk(spark: Any, args: argparse.Namespace, deployment: Any, work: Path) -> dict[str, Any]:
    from spark_connector.options import DEFAULT_MAX_ROWS_PER_PARTITION

    rows = args.rows
    publisher = subprocess.run(
        [sys.executable, "-c", BULK_PUBLISHER, deployment.driver_socket, TOPIC, str(rows),
         str(args.size)],
        capture_output=True, text=True, check=True, timeout=LIMIT,
    )  # fmt: skip
    publish_seconds = float(publisher.stdout.split()[-1])
    print(f"bulk publisher: {rows} rows in {publish_seconds} s", flush=True)
    frame = spark.range(rows, numPartitions=args.partitions).selectExpr(
        f"cast(concat(lpad(cast(id as string), 9, '0'), repeat('x', {args.size - 9})) as binary)"
        " as value"
    )
    parquet = str(work / "rows.parquet")
    frame.write.parquet(parquet)
    partitions = max(1, -(-rows // DEFAULT_MAX_ROWS_PER_PARTITION))  # the source's tasks
    spark.dataSource.register(trivial_source(partitions, rows, args.size, True))
    figures: dict[str, list[dict[str, Any]]] = {}

    def source_batch() -> None:
        df = spark.read.format("episub").option("topic", TOPIC).load()
        df.write.format("noop").mode("overwrite").save()

    def source_stream() -> None:
        query = (
            spark.readStream.format("episub").option("topic", TOPIC)
            .option("startingOffsets", "earliest").load()
            .writeStream.format("noop").trigger(availableNow=True)
            .option("checkpointLocation", str(work / f"cp-src-{time.monotonic_ns()}"))
            .start()
        )  # fmt: skip
        query.awaitTermination(LIMIT)
        assert query.exception() is None, query.exception()

    def trivial() -> None:
        spark.read.format("bench_trivial").load().write.format("noop").mode("overwrite").save()

    def sink_write() -> None:
        spark.read.parquet(parquet).write.format("episub").option("topic", "bench-sink").mode(
            "append"
        ).save()

    def sink_stream() -> None:
        query = (
            spark.readStream.schema("value binary").parquet(parquet)
            .writeStream.format("episub").option("topic", "bench-sink")
            .option("checkpointLocation", str(work / f"cp-sink-{time.monotonic_ns()}"))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination(LIMIT)
        assert query.exception() is None, query.exception()

    runs = {
        "source_batch_read": source_batch,
        "source_stream_available_now": source_stream,
        "trivial_python_source": trivial,
        "sink_df_write": sink_write,
        "sink_write_stream": sink_stream,
    }
    trivial()  # warm-up: Python workers, the data sources' planners
    source_batch()
    for _ in range(args.repeat):  # interleaved
        for name, action in runs.items():
            figures.setdefault(name, []).append(timed(name, action, rows))
    best = {name: max(r["rows_per_s"] for r in runs_) for name, runs_ in figures.items()}
    return {
        "rows": rows,
        "size": args.size,
        "publisher_rows_per_s": round(rows / publish_seconds) if publish_seconds else None,
        "runs": figures,
        "best_rows_per_s": best,
        "source_over_trivial": round(best["source_batch_read"] / best["trivial_python_source"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("paced", "burst", "bulk", "steady"), default="paced")
    parser.add_argument("--rows", type=int, default=1_000_000, help="bulk: rows")
    parser.add_argument("--partitions", type=int, default=10, help="bulk: sink partitions")
    parser.add_argument("--repeat", type=int, default=2, help="bulk: interleaved rounds")
    parser.add_argument("--trigger", type=float, default=0.0, help="paced: trigger seconds")
    parser.add_argument("--rate", type=int, default=1000, help="paced: msgs/s")
    parser.add_argument("--seconds", type=float, default=30.0, help="paced: how long")
    parser.add_argument("--messages", type=int, default=100_000, help="burst: how many")
    parser.add_argument("--burst-rate", type=int, default=20_000, help="burst: rate's rows/s")
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--warmup", type=int, default=2000, help="episub warm-up messages")
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()
    out = args.out or Path(__file__).parent / "results" / f"spark_stream_{args.mode}.json"

    from pyspark.sql import SparkSession

    import spark_connector

    spark = (
        SparkSession.builder.master(args.master)
        .appName("episub-bench-stream")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        from episub.proto.store import RetentionConfig

        retention = RetentionConfig(max_messages=100_000, max_bytes=1 << 30)
        deployment = spark_connector.register(spark, key=KEY, retention=retention)
        sc = spark.sparkContext
        if args.master.startswith("local-cluster"):
            wait(lambda: sc._jsc.sc().getExecutorMemoryStatus().size() == 3, "two executors")
        spark_connector.overlay(spark, deployment)  # every executor's agent up first
        if args.mode == "steady":
            rate_figures, episub_figures = None, run_steady(spark, args, deployment)
        elif args.mode == "bulk":
            import tempfile

            with tempfile.TemporaryDirectory(prefix="episub-bench-") as work:
                bulk = run_bulk(spark, args, deployment, Path(work))
            rate_figures, episub_figures = None, bulk
        else:
            rate_figures = run_rate(spark, args)
            episub_figures = run_episub(spark, args, deployment)
    finally:
        spark.stop()
    result = {
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "mode": args.mode,
        "load_before": load_before,
        "master": args.master,
        "size": args.size,
        "episub": episub_figures,
        "rate": rate_figures,
        "pyspark": __import__("pyspark").__version__,
        "cpus": os.cpu_count(),
    }
    result["load_after"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
