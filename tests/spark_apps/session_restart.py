"""A Spark application on local[2] that stops its session while two queries run and starts
them again in a new session of the same process, from their checkpoints: a `rate` source
written to topic `t` (the episub sink) and an episub reader of `t` written to parquet.

    session_restart.py KEY_HEX WORKDIR ROWS

The first session runs until the reader has written some rows; `spark.stop()` then ends
both queries mid-stream. The second session calls `register` with the same key and restarts
both; once the rate source has produced ROWS rows it stops, and the reader drains. Prints
one JSON line: {"rows": n, "distinct": (publisher, seq) pairs, "values": distinct values,
"in_range": bool, "error": str | null}, or {"error": ...} when the run broke off.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession
from pyspark.sql.functions import col

import spark_connector

LIMIT = 120.0  # s: the longest either session may take to reach its mark


def session() -> SparkSession:
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def start(spark: SparkSession, work: str, rows: int):  # type: ignore[no-untyped-def]
    # The rate source's value numbers its rows: each one once in the topic, replays included.
    writer = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 1000)
        .option("numPartitions", 2)
        .load()
        .where(col("value") < rows)
        .select(col("value").cast("string").alias("value"))
        .writeStream.format("episub")
        .option("topic", "t")
        .option("checkpointLocation", os.path.join(work, "writer-checkpoint"))
        .trigger(processingTime="250 milliseconds")
        .start()
    )
    reader = (
        spark.readStream.format("episub")
        .option("topic", "t")
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("parquet")
        .option("path", os.path.join(work, "out"))
        .option("checkpointLocation", os.path.join(work, "reader-checkpoint"))
        .trigger(processingTime="250 milliseconds")
        .start()
    )
    return writer, reader


def written(spark: SparkSession, work: str) -> int:
    out = os.path.join(work, "out")
    if not os.path.exists(os.path.join(out, "_spark_metadata")):
        return 0
    return spark.read.schema(spark_connector.SCHEMA).parquet(out).count()


def wait(condition, queries, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + LIMIT
    while not condition():
        for q in queries:
            if q.exception() is not None:
                raise RuntimeError(f"{q.name or q.id}: {q.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.25)  # the next look at the queries' progress: no event to await


def end_queries(queries) -> None:  # type: ignore[no-untyped-def]
    """Stop a stopped session's queries and wait for their threads to end. Spark does not
    stop them with the session: the writer fails at its next job, but a reader with no new
    rows runs no job and goes on planning on its checkpoint, and once the restarted writer
    publishes, it writes the same batch there as the restarted reader ("Multiple
    streaming queries are concurrently using" it)."""
    for query in queries:
        with contextlib.suppress(Exception):  # marked stopped, then its job cancel fails
            query.stop()
    for query in queries:
        try:
            ended = query.awaitTermination(LIMIT)
        except Exception:  # it ended with an error (the writer's stopped context)
            ended = True
        if not ended:
            raise RuntimeError(f"a query of the stopped session still runs after {LIMIT} s")


def main() -> None:
    try:
        result = restart_and_read(*sys.argv[1:4])
    except Exception as exc:  # reported in the JSON line: the test shows it
        result = {"error": f"{type(exc).__name__}: {exc}"[-4000:]}
    print(json.dumps(result), flush=True)


def restart_and_read(key_hex: str, work: str, rows_text: str) -> dict[str, object]:
    key, rows = bytes.fromhex(key_hex), int(rows_text)
    error = None
    spark = session()
    spark_connector.register(spark, key=key)
    queries = start(spark, work, rows)
    try:
        wait(lambda: written(spark, work) >= rows // 3, queries, "rows in the first session")
    finally:
        spark.stop()  # while both queries run
    end_queries(queries)
    spark = session()
    spark_connector.register(spark, key=key)
    writer, reader = start(spark, work, rows)
    try:
        wait(
            lambda: (
                (writer.lastProgress or {}).get("sources", [{}])[0].get("endOffset") is not None
                and written(spark, work) >= rows
            ),
            [writer, reader],
            "every row read in the second session",
        )
    except RuntimeError as exc:
        error = str(exc)
    read = spark.read.schema(spark_connector.SCHEMA).parquet(os.path.join(work, "out"))
    values = [int(r.value) for r in read.select("value").collect()]
    keys = read.select("publisher", "seq").distinct().count()
    writer.stop()
    reader.stop()
    spark.stop()
    return {
        "rows": len(values),
        "distinct": keys,
        "values": len(set(values)),
        "in_range": all(0 <= v < rows for v in values),
        "error": error,
    }


if __name__ == "__main__":
    main()
