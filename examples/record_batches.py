"""Rows at Arrow speed: record batches in, micro-batches bounded in rows, a copy out (local[2]).

    .venv/bin/python examples/record_batches.py

1. A publisher outside Spark (a client of the driver's agent, as `episub publish` would be
   of its own) publishes 10,000 rows as record batches of 1,000 rows on its named stream
   "orders/1": ten overlay messages, each row keeping its own offset.
2. A streaming query reads them with maxOffsetsPerTrigger=4000: micro-batches of at most
   4,000 rows, ending inside a record batch where the budget says (offsets count rows).
3. A batch write copies them through the sink to topic "copied" (rows travel as record
   batches again), and a reader outside Spark sees the copy row by row (`unbatch`).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession

import spark_connector
from episub.agent import AgentClient
from episub.recordbatch import unbatch
from spark_connector.deployment import driver_client

KEY = bytes(32)  # the deployment's key; outside processes need it too. Use a secret one.
ROWS = 10_000
WAIT = 120.0  # seconds: the longest the example waits for its rows


def main() -> None:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("episub-record-batches")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    deployment = spark_connector.register(spark, key=KEY)

    # 1. Ten record batches of 1,000 rows on the named stream "orders/1".
    now = int(time.time() * 1000)
    rows = [(now, b"customer-%d" % (i % 7), b"order %d" % i, ()) for i in range(ROWS)]
    with AgentClient(deployment.driver_socket) as client:
        client.join("orders")
        place, next_row = client.publish_rows("orders", b"orders/1", rows, batch_rows=1000)
    print(f"published {next_row} rows in {place} record batches")

    # 2. Micro-batches of at most 4,000 rows.
    with tempfile.TemporaryDirectory() as checkpoint:
        query = (
            spark.readStream.format("episub")
            .option("topic", "orders")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", 4000)
            .load()
            .writeStream.format("memory")
            .queryName("orders")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(WAIT)
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    seqs = sorted(r.seq for r in spark.sql("select seq from orders").collect())
    assert seqs == list(range(ROWS)), "every row once, offsets without gaps"
    print(f"read {len(seqs)} rows in micro-batches of {sizes} rows")

    # 3. The copy, through the sink; read outside Spark row by row.
    spark.sql("select key, value from orders").write.format("episub").option(
        "topic", "copied"
    ).mode("append").save()
    with driver_client(deployment) as client:
        copied = []
        for publisher, span in client.offsets("copied").items():
            for message in client.read_range("copied", publisher, span.first, span.last):
                copied += unbatch(message)
    assert sorted(m.value for m in copied) == sorted(r[2] for r in rows)
    print(f"the copy holds {len(copied)} rows, each once")
    spark.stop()


if __name__ == "__main__":
    main()
