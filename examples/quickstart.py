"""episub in Spark, on your laptop: a topic as a streaming source and sink (local[2]).

    .venv/bin/python examples/quickstart.py            # or: bash scripts/demo.sh

1. `spark_connector.register(spark)` starts the driver's episub node and registers the
   `episub` format.
2. A streaming query reads topic "events" and prints each micro-batch.
3. `episub publish` (another OS process, its own node) publishes 5 messages, and a
   writing query publishes 5 more through the sink, from Spark's executor.
4. The reading query prints all ten, each once; then everything stops.

Run it with --master local-cluster[2,1,1024] for the same pipeline on two executors.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession

import spark_connector

KEY = bytes(32)  # the deployment's key; outside processes need it too. Use a secret one.
WAIT = 120.0  # seconds: the longest the demo waits for its rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    spark = (
        SparkSession.builder.master(args.master)
        .appName("episub-quickstart")
        .config("spark.ui.enabled", "false")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    deployment = spark_connector.register(spark, key=KEY)
    print(f"driver node at {deployment.bootstrap[0]}")

    events = (
        spark.readStream.format("episub")
        .option("topic", "events")
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("publisher", "seq", "cast(value as string) as value")
    )
    reading = (
        events.writeStream.format("console")
        .option("truncate", "false")
        .trigger(processingTime="1 second")
        .start()
    )
    # Five messages from outside Spark: the `episub` command is a node of its own.
    subprocess.run(
        [sys.executable, "-m", "episub.cli", "publish", "--bootstrap", deployment.bootstrap[0],
         "--topic", "events", "--summary", *[f"from the command line {i}" for i in range(5)]],
        env={**os.environ, "EPISUB_KEY": KEY.hex()}, check=True,
    )  # fmt: skip
    # Five through the sink: a streaming query publishing from the executors.
    with tempfile.TemporaryDirectory() as checkpoint:
        rows = spark.createDataFrame([(f"from Spark {i}",) for i in range(5)], "value string")
        rows.write.mode("overwrite").parquet(os.path.join(checkpoint, "rows"))
        writing = (
            spark.readStream.schema("value string")
            .parquet(os.path.join(checkpoint, "rows"))
            .writeStream.format("episub")
            .option("topic", "events")
            .option("checkpointLocation", os.path.join(checkpoint, "writer"))
            .trigger(availableNow=True)
            .start()
        )
        writing.awaitTermination(WAIT)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        reading.processAllAvailable()
        seen = sum(p["numInputRows"] for p in reading.recentProgress)
        if seen >= 10:
            break
        time.sleep(0.5)
    reading.stop()
    print(f"read {seen} messages from topic 'events'")
    spark.stop()


if __name__ == "__main__":
    main()
