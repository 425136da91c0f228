"""Live configuration in Spark: change a threshold and a feature flag while a streaming
query runs, with no restart, no re-broadcast and no server (local[2]).

    .venv/bin/python examples/live_config.py
    .venv/bin/python examples/live_config.py --master 'local-cluster[2,1,1024]'

1. `cluster_config(spark)` gives the driver a handle on the application's configuration.
2. A streaming query over the `rate` source keeps the rows whose `value % 100` is below
   `threshold`, while `enabled` is true. Its UDFs read both with
   `spark_connector.config.get(...)` from their own executor's node.
3. The driver sets threshold 50, then 10, then turns the flag off; each change shows in
   the next micro-batches, printed by foreachBatch.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import col, udf
from pyspark.sql.types import BooleanType, IntegerType

import spark_connector

WAIT = 120.0  # seconds: the longest the example waits for a change to show


@udf(BooleanType())
def keep(value: int) -> bool:
    from spark_connector import config

    return bool(config.get("enabled", True)) and value % 100 < config.get("threshold", 100)


@udf(IntegerType())
def threshold_in_task(_: int) -> int:
    from spark_connector import config

    return config.get("threshold", 100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    spark = (
        SparkSession.builder.master(args.master)
        .appName("episub-live-config")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)
    cfg = spark_connector.cluster_config(spark)  # before starting the query: see docs
    cfg.update({"threshold": 100, "enabled": True})

    batches: list[tuple[int, list[int]]] = []  # (rows kept, thresholds the tasks saw)
    arrived = threading.Condition()

    def report(batch: DataFrame, batch_id: int) -> None:
        rows = batch.collect()
        thresholds = sorted({r.threshold for r in rows})
        print(f"batch {batch_id}: kept {len(rows)} rows; tasks saw threshold {thresholds}")
        with arrived:
            batches.append((len(rows), thresholds))
            arrived.notify_all()

    rows = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    kept = rows.select("value", threshold_in_task(col("value")).alias("threshold"))
    query = (
        kept.where(keep(col("value")))
        .writeStream.foreachBatch(report)
        .trigger(processingTime="1 second")
        .start()
    )

    def wait_for_batch(what: str, done) -> None:  # type: ignore[no-untyped-def]
        with arrived:
            if not arrived.wait_for(lambda: batches and done(*batches[-1]), timeout=WAIT):
                raise SystemExit(f"no batch showed {what} within {WAIT} s")

    try:
        for threshold in (50, 10):
            version = cfg.set("threshold", threshold)
            print(f"driver: threshold = {threshold} (version {version})")
            wait_for_batch(f"threshold {threshold}", lambda n, seen, t=threshold: seen == [t])
        version = cfg.set("enabled", False)
        print(f"driver: enabled = False (version {version})")
        wait_for_batch("the flag off", lambda n, seen: n == 0)
    finally:
        query.stop()
        spark.stop()
    print("every change reached the running query")


if __name__ == "__main__":
    started = time.monotonic()
    main()
    print(f"done in {time.monotonic() - started:.0f} s")
