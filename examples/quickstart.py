"""episub in Spark, on your laptop: a topic as a streaming source and sink (local[2]).

    .venv/bin/python examples/quickstart.py            # or: bash scripts/demo.sh

1. `spark_connector.register(spark)` starts the driver's episub node and registers the
   `episub` format.
2. A streaming query reads topic "events" into a table.
3. `episub publish` (another OS process, its own node) publishes 5 messages, and a
   writing query publishes 5 more through the sink, from Spark's executor.
4. The table holds all ten, each once; it is printed, then everything stops.

Run it with --master local-cluster[2,1,1024] for the same pipeline on two executors, or
with --remote sc://HOST:PORT as a Spark Connect client of a server started with this
environment's Python (README, "Spark Connect"): the driver's node then runs beside the
server, and the writing query's checkpoint is a directory on the server's machine.
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
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--master", default="local[2]", help="run Spark here (default)")
    where.add_argument("--remote", metavar="sc://HOST:PORT", help="a Spark Connect server")
    args = parser.parse_args()
    if args.remote:
        spark = SparkSession.builder.remote(args.remote).getOrCreate()
    else:
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
        events.writeStream.format("memory")  # a table this process can query, here or remote
        .queryName("events")
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
        writing = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", 5)
            .load()
            .selectExpr("concat('from Spark ', value) as value")
            .writeStream.format("episub")
            .option("topic", "events")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        writing.awaitTermination(WAIT)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        reading.processAllAvailable()
        if spark.sql("select count(*) as n from events").first().n >= 10:
            break
        time.sleep(0.5)
    reading.stop()
    rows = spark.sql("select publisher, seq, value from events order by value").collect()
    for row in rows:
        print(f"{row.value:<26} from {row.publisher}, seq {row.seq}")
    print(f"read {len(rows)} messages from topic 'events'")
    spark.stop()


if __name__ == "__main__":
    main()
