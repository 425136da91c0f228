"""What the sink's acknowledgement (`acks`: local, 1, all) costs, on local-cluster[2,1,1024].

    .venv/bin/python benchmarks/sink_acks.py --rounds 3 --rows 50000

Two measurements per level, the levels interleaved round after round in one application
(so that each sees the same warm JVMs, workers and agents):

- batch: `df.write.format("episub")` of --rows rows of --size bytes in 2 partitions; the
  figure is rows/s over the whole write (each task waits once, at its end, for its rows to
  be held by another node, acks=1, or by every neighbour, acks=all).
- stream: a streaming sink from Spark's rate-micro-batch source, --batch-rows rows per
  micro-batch, --batches micro-batches; the figure is the median of Spark's addBatch time
  (the write of one micro-batch, its index commit included), which is where a small batch
  pays the acknowledgement's round trips.

Warm-up: one unmeasured write and stream at acks=local first. Writes JSON with the command
line and the machine's load to --out (default benchmarks/results/sink_acks.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

LEVELS = ("local", "1", "all")


def batch_write(spark: Any, topic: str, rows: int, size: int, acks: str) -> float:
    frame = spark.range(rows).selectExpr(f"cast(repeat('x', {size}) as binary) as value")
    frame = frame.repartition(2).cache()
    frame.count()  # built before the clock starts
    started = time.perf_counter()
    frame.write.format("episub").option("topic", topic).option("acks", acks).mode("append").save()
    elapsed = time.perf_counter() - started
    frame.unpersist()
    return rows / elapsed


def stream_write(spark: Any, topic: str, batch_rows: int, batches: int, acks: str) -> float:
    checkpoint = tempfile.mkdtemp(prefix="sink-acks-")
    query = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", batch_rows)
        .option("numPartitions", 2)
        .load()
        .selectExpr("cast(value as string) as value")
        .writeStream.format("episub")
        .option("topic", topic)
        .option("acks", acks)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )
    seen: dict[int, int] = {}
    while len(seen) < batches:
        for progress in query.recentProgress:
            if progress["numInputRows"]:
                seen[progress["batchId"]] = progress["durationMs"]["addBatch"]
        time.sleep(0.2)  # the next look at the query's progress
    query.stop()
    return float(statistics.median(list(seen.values())[:batches]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch-rows", type=int, default=100)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--out", default="benchmarks/results/sink_acks.json")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    import spark_connector

    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .config("spark.ui.enabled", "false")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    results: dict[str, dict[str, list[float]]] = {a: {"batch": [], "stream": []} for a in LEVELS}
    failures: list[str] = []
    try:
        spark_connector.register(spark)
        batch_write(spark, "warm", args.rows // 5, args.size, "local")
        stream_write(spark, "warm", args.batch_rows, 5, "local")
        for round_ in range(args.rounds):
            for acks in LEVELS:
                topic = f"acks-{acks}-{round_}"
                try:
                    rate = batch_write(spark, topic, args.rows, args.size, acks)
                    added = stream_write(spark, topic + "-s", args.batch_rows, args.batches, acks)
                except Exception as exc:  # an ack timeout is a figure too: record it, go on
                    failures.append(f"round {round_} acks={acks}: {str(exc)[-600:]}")
                    print(failures[-1])
                    continue
                results[acks]["batch"].append(round(rate))
                results[acks]["stream"].append(added)
                print(f"round {round_} acks={acks}: {rate:,.0f} rows/s; addBatch {added:.0f} ms")
    finally:
        spark.stop()
    summary = {
        acks: {
            "batch_rows_per_s_median": statistics.median(r["batch"]) if r["batch"] else None,
            "stream_add_batch_ms_median": statistics.median(r["stream"]) if r["stream"] else None,
            **r,
        }
        for acks, r in results.items()
    }
    out = {
        "command": " ".join(sys.argv),
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
        "results": summary,
        "failures": failures,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    for acks, r in summary.items():
        if r["batch"]:
            print(
                f"acks={acks}: batch {r['batch_rows_per_s_median']:,.0f} rows/s, "
                f"stream addBatch {r['stream_add_batch_ms_median']:.0f} ms (medians)"
            )
    for failure in failures:
        print(f"failed: {failure}")


if __name__ == "__main__":
    main()
