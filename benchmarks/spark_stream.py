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
- burst: the publisher publishes --messages as fast as it can, before the query starts
  (startingOffsets earliest), so the query reads a backlog; `rate` gets rowsPerSecond set
  high. Rows/s is the figure to read: the engine's ceiling with `rate`, ours with episub.

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

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

KEY = bytes(range(32))
TOPIC = "bench"
LIMIT = 600.0  # s: the longest one run may take

PUBLISHER = r"""
import sys, time, trio
from episub import Node
key, bootstrap, topic = bytes.fromhex(sys.argv[1]), sys.argv[2], sys.argv[3]
count, rate, size = int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])

async def main():
    async with Node(key=key, listen="127.0.0.1:0") as node:
        await node.join(topic, bootstrap=[bootstrap])
        print("joined", flush=True)
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
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class BatchLog:
    """What the foreachBatch sink saw: per batch, rows and their visible-minus-stamp."""

    def __init__(self) -> None:
        self.rows = 0
        self.first: float | None = None
        self.last: float | None = None
        self.latencies_ms: list[float] = []
        self.batches = 0
        self.lock = threading.Lock()

    def sink(self, column: str) -> Any:
        def on_batch(batch: Any, batch_id: int) -> None:
            stamps = [r[0] for r in batch.select(column).collect()]
            now = time.time()
            with self.lock:
                self.batches += 1
                if not stamps:
                    return
                self.first = self.first or now
                self.last = now
                self.rows += len(stamps)
                self.latencies_ms += [(now - s.timestamp()) * 1000 for s in stamps]

        return on_batch

    def summary(self) -> dict[str, Any]:
        span = (self.last - self.first) if self.first and self.last else 0.0
        return {
            "rows": self.rows,
            "batches": self.batches,
            "rows_per_s": round(self.rows / span, 1) if span > 0 else None,
            "latency_ms_p50": _round(percentile(self.latencies_ms, 0.50)),
            "latency_ms_p99": _round(percentile(self.latencies_ms, 0.99)),
            "latency_ms_mean": _round(statistics.fmean(self.latencies_ms))
            if self.latencies_ms
            else None,
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
         str(count), str(rate), str(args.size), str(LIMIT)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    log = BatchLog()
    query = None
    try:
        assert publisher.stdout is not None
        assert publisher.stdout.readline().strip() == "joined"
        if args.mode == "burst":
            print(publisher.stdout.readline().strip(), file=sys.stderr)
        query = (
            spark.readStream.format("episub")
            .option("topic", TOPIC)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.foreachBatch(log.sink("timestamp"))
            .start()
        )
        wait(lambda: log.rows >= count, f"{count} rows")
    finally:
        if query is not None:
            query.stop()
        publisher.kill()
        publisher.wait()
    return {"published": count, **log.summary()}


def run_rate(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    rate = args.rate if args.mode == "paced" else args.burst_rate
    count = int(args.rate * args.seconds) if args.mode == "paced" else args.messages
    log = BatchLog()
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rate)
        .option("numPartitions", 2)
        .load()
        .writeStream.foreachBatch(log.sink("timestamp"))
        .start()
    )
    try:
        wait(lambda: log.rows >= count, f"{count} rate rows")
    finally:
        query.stop()
    return {"rows_per_second_option": rate, **log.summary()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("paced", "burst"), default="paced")
    parser.add_argument("--rate", type=int, default=1000, help="paced: msgs/s")
    parser.add_argument("--seconds", type=float, default=30.0, help="paced: how long")
    parser.add_argument("--messages", type=int, default=100_000, help="burst: how many")
    parser.add_argument("--burst-rate", type=int, default=200_000, help="burst: rate's rows/s")
    parser.add_argument("--size", type=int, default=100, help="value bytes")
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
