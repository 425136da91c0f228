"""A sink-to-source pipeline of 200 micro-batches on real Spark (local[2]), for issue 15's
acceptance 3: the reading query's checkpointed offsets stop growing once retention forgets
old streams. Run by tests/test_spark_pipeline_offsets.py (on demand: EPISUB_ONDEMAND=1).

Two sink queries write topic `pipe` from Spark's rate-micro-batch source: `steady` for the
whole run, `short` for its first batches only, then stopped. A third query reads `pipe`
from the earliest row until it has run BATCHES batches. Retention keeps what is younger
than RETENTION seconds, so `short`'s streams age out mid-run and, GONE_GRACE later, leave
the offsets. Prints, as JSON on stdout's last line, for each of the reader's batches: the
publishers in its offsets and the size of the offsets' JSON, and the rows read.

    pipeline_offsets.py WORK_DIR
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession

import spark_connector
from episub import RetentionConfig
from spark_connector.planner import NEW_MARK

BATCHES = 200
RETENTION = 10.0  # s
SHORT_BATCHES = 20
PARTITIONS = 2
ROWS_PER_BATCH = 20
LIMIT = 1200.0  # s


def sink(spark: SparkSession, name: str, work: Path):  # type: ignore[no-untyped-def]
    return (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", ROWS_PER_BATCH)
        .option("numPartitions", PARTITIONS)
        .load()
        .selectExpr(f"concat('{name} ', value) as value")
        .writeStream.format("episub")
        .option("topic", "pipe")
        .option("checkpointLocation", str(work / f"{name}-checkpoint"))
        .queryName(name)
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def main() -> None:
    work = Path(sys.argv[1])
    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        spark_connector.register(spark, retention=RetentionConfig(max_age=RETENTION))
        steady, short = sink(spark, "steady", work), sink(spark, "short", work)
        reader = (
            spark.readStream.format("episub")
            .option("topic", "pipe")
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(work / "reader-checkpoint"))
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        deadline = time.monotonic() + LIMIT
        ends: dict[int, str] = {}  # batch -> the source's end offsets (Spark keeps 100)
        while len(ends) < BATCHES:
            for progress in reader.recentProgress:
                ends[progress["batchId"]] = progress["sources"][0]["endOffset"]
            if (
                short is not None
                and short.lastProgress
                and short.lastProgress["batchId"] >= SHORT_BATCHES
            ):
                short.stop()
                short = None
            if time.monotonic() > deadline or reader.exception() or steady.exception():
                raise SystemExit(f"stuck: {reader.exception() or steady.exception()}")
            time.sleep(0.25)  # the next look at the queries' progress (a batch: 0.5 s)
        reader.stop()
        steady.stop()
        found = []
        for batch in sorted(ends)[:BATCHES]:
            offsets = json.loads(ends[batch])
            # A batch's end also names where a publisher first seen at it starts
            # (planner.NEW_MARK + publisher): a mark, not a publisher.
            streams = [p for p in offsets.get("pipe", {}) if not p.startswith(NEW_MARK)]
            found.append({"publishers": len(streams), "json": len(ends[batch])})
        print(json.dumps({"batches": found}), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
