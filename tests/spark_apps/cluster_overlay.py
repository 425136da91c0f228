"""A Spark application on local-cluster[2,1,1024]: registers episub, waits until every
node has neighbours with measured RTTs, and prints the overlay as JSON on stdout's last
line. Run by tests/test_spark_cluster.py as its own OS process, so that the test can check
that no agent outlives the application."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession

import spark_connector

SETTLE_LIMIT = 60.0  # s: bounded wait for pings to measure every link


def main() -> None:
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .config("spark.ui.enabled", "false")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    try:
        deployment = spark_connector.register(spark)
        deadline = time.monotonic() + SETTLE_LIMIT
        while True:
            views = spark_connector.overlay(spark, deployment)
            settled = len(views) == 3 and all(
                v.neighbors and all(n["rtt_ms"] is not None for n in v.neighbors) for v in views
            )
            if settled or time.monotonic() > deadline:
                break
            time.sleep(0.5)  # the next look; pings run every second
        print(json.dumps([dataclasses.asdict(v) for v in views]))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
