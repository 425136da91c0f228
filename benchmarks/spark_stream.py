"""The episub source end to end on a two-executor Spark cluster, beside Spark's `rate` source.

    .venv/bin/python benchmarks/spark_stream.py --mode paced --rate 1000 --seconds 30
    .venv/bin/python benchmarks/spark_stream.py --mode burst --messages 100000

Both sources feed the same sink: a foreachBatch on the driver that collects each batch's
`timestamp` column. A row's latency is the time that collect returned (the row is then
visible to the application) minus its timestamp: the publisher's clock at publish for
episub, the row's generation time for `rate` (both the same host's wall clock). Rows/s is
rows seen over the time from the first to the last batch that had rows.

- paced: one external node process publishes --rate msgs/s for --seconds (100-byte values);
  `rate` runs at the same rowsPerSecond. Latency is the figure to read.
- burst: the publisher publishes --messages as fast as it can; `rate` gets rowsPerSecond
  set high. Rows/s is the figure to read: the engine's ceiling with `rate`, ours with episub.

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
            .start()
        )
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
        .start()
    )
    try:
        wait(lambda: log.rows + log.warm_rows >= count, f"{count} rate rows")
    finally:
        query.stop()
    return {"rows_per_second_option": rate, **log.summary()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("paced", "burst"), default="paced")
    parser.add_argument("--rate", type=int, default=1000, help="paced: msgs/s")
    parser.add_argument("--seconds", type=float, default=30.0, help="paced: how long")
    parser.add_argument("--messages", type=int, default=100_000, help="burst: how many")
    parser.add_argument("--burst-rate", type=int, default=20_000, help="burst: rate's rows/s")
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--warmup", type=int, default=2000, help="episub warm-up messages")
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
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
        deployment = spark_connector.register(spark, key=KEY)
        sc = spark.sparkContext
        if args.master.startswith("local-cluster"):
            wait(lambda: sc._jsc.sc().getExecutorMemoryStatus().size() == 3, "two executors")
        spark_connector.overlay(spark, deployment)  # every executor's agent up first
        rate_figures = run_rate(spark, args)
        episub_figures = run_episub(spark, args, deployment)
    finally:
        spark.stop()
    result = {
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "mode": args.mode,
        "master": args.master,
        "size": args.size,
        "episub": episub_figures,
        "rate": rate_figures,
        "pyspark": __import__("pyspark").__version__,
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
