"""episub in Spark as a Kafka user knows it: a service outside Spark publishes, a query reads.

    .venv/bin/python examples/from_kafka.py

1. An `episub node` process outside Spark (a service's node) publishes 200 orders into
   topic "orders".
2. `register(spark, key=KEY, bootstrap=[its address], metrics=True)`: the driver's node
   finds what the outside node holds, and every agent serves Prometheus metrics.
3. A streaming query reads the orders with Kafka's options (`subscribe`,
   `startingOffsets=earliest`, `maxOffsetsPerTrigger`) and shows its lag from
   `query.lastProgress`.
4. A batch write with `acks=all` and a batch read between two offsets
   (`spark.read.format("episub")`).
5. `spark_connector.overlay(spark)` says where to scrape each node's metrics.

docs/spark.md ("Coming from Kafka") maps every Kafka option to episub's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession

import spark_connector
from episub.agent import AgentClient

KEY = bytes(32)  # the deployment's key; outside processes need it too. Use a secret one.
ORDERS = 200
WAIT = 120.0  # seconds: the longest the example waits for its rows


def start_outside_node(socket: str) -> tuple[subprocess.Popen[str], str]:
    """A service's own node, outside Spark: `episub node`, serving its agent socket."""
    node = subprocess.Popen(
        [sys.executable, "-m", "episub.cli", "node", "--listen", "127.0.0.1:0",
         "--topic", "orders", "--socket", socket],
        env={**os.environ, "EPISUB_KEY": KEY.hex()}, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert node.stdout is not None
    ready = node.stdout.readline().split()  # "episub node ID listening on ADDRESS"
    return node, ready[5]


def main() -> None:
    directory = tempfile.mkdtemp(prefix="ep-")
    node, address = start_outside_node(f"{directory}/orders.sock")
    try:
        with AgentClient(f"{directory}/orders.sock") as service:
            service.publish_batch("orders", [b"order %d" % i for i in range(ORDERS)])
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("episub-from-kafka")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        spark_connector.register(spark, key=KEY, bootstrap=[address], metrics=True)
        run(spark)
        spark.stop()
    finally:
        node.terminate()
        node.wait(timeout=30)


def run(spark: SparkSession) -> None:
    orders = (
        spark.readStream.format("episub")
        .option("subscribe", "orders")  # Kafka's names, Kafka's meaning
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 50)
        .load()
    )
    query = orders.writeStream.format("memory").queryName("orders").start()
    deadline = time.monotonic() + WAIT
    while spark.sql("select count(*) as n from orders").first().n < ORDERS:
        assert time.monotonic() < deadline, "the orders did not all arrive"
        query.processAllAvailable()
    first = next(p for p in query.recentProgress if p["numInputRows"])
    print(f"first micro-batch: {first['numInputRows']} rows, {spark_connector.lag(first)} behind")
    print(f"read {spark.sql('select count(*) as n from orders').first().n} orders from outside")
    query.stop()

    frame = spark.createDataFrame([(f"refund {i}",) for i in range(100)], "value string")
    sink = frame.write.format("episub").mode("append").option("topic", "refunds")
    sink.option("acks", "all").save()  # each row held by every neighbour of its node
    publisher = spark.read.format("episub").option("topic", "refunds").load().first().publisher
    some = (
        spark.read.format("episub")
        .option("topic", "refunds")
        .option("startingOffsets", json.dumps({"refunds": {publisher: 10}}))
        .option("endingOffsets", json.dumps({"refunds": {publisher: 20}}))
        .load()
    )
    print(f"wrote 100 refunds with acks=all; seqs 10..19 of one stream: {some.count()} rows")

    for view in spark_connector.overlay(spark):
        print(f"{view.role} node at {view.address}: metrics at {view.metrics_url}")


if __name__ == "__main__":
    main()
