"""A Spark application on local[2] that stops its session while two queries run and starts
them again in a new session of the same process, from their checkpoints: a `rate` source
written to topic `t` (the episub sink) and an episub reader of `t` written to parquet.

    session_restart.py KEY_HEX WORKDIR ROWS

The first session runs until the reader has written some rows; `spark.stop()` then ends
both queries mid-stream. The second session calls `register` with the same key and restarts
both; once the rate source has produced ROWS rows it stops, and the reader drains. Prints
one JSON line: {"rows": n, "distinct": (publisher, seq) pairs, "values": distinct values,
"in_range": bool, "error": str | null, "worker_starts": n}, or {"error": ...} when the run
broke off.

Spark 4.3 gives the Python process of a query's planning (a source's offsets, a sink's
commit) a fixed 10 s to start and connect back (PythonWorkerFactory.createSimpleWorker; no
configuration raises it), which a loaded 2-core machine sometimes exceeds: "Python worker
failed to connect back". A query that ends with that error is started again from its
checkpoint, as a supervisor would, at most WORKER_START_RETRIES times a query;
"worker_starts" counts those restarts. Any other error ends the run.
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
WORKER_START_FAILED = "Python worker failed to connect back"  # Spark's fixed 10 s start limit
WORKER_START_RETRIES = 3  # per query: past it, the run breaks off with the error


def session() -> SparkSession:
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class Queries:
    """The session's two queries, each started again from its checkpoint when it ended on
    Spark's Python worker start limit (see the module doc)."""

    def __init__(self, spark: SparkSession, work: str, rows: int) -> None:
        self.starters = {
            "writer": lambda: start_writer(spark, work, rows),
            "reader": lambda: start_reader(spark, work),
        }
        self.running = {name: begin() for name, begin in self.starters.items()}
        self.restarts = {name: 0 for name in self.starters}

    def check(self) -> None:
        """Raise a query's error, unless it is the start limit's: start that one again."""
        for name, query in list(self.running.items()):
            error = query.exception()
            if error is None:
                continue
            if WORKER_START_FAILED in str(error) and self.restarts[name] < WORKER_START_RETRIES:
                self.restarts[name] += 1
                print(f"the {name} hit Spark's worker start limit; started again", file=sys.stderr)
                self.running[name] = self.starters[name]()
                continue
            raise RuntimeError(f"{query.name or query.id}: {error}")


def start_writer(spark: SparkSession, work: str, rows: int):  # type: ignore[no-untyped-def]
    # The rate source's value numbers its rows: each one once in the topic, replays included.
    return (
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


def start_reader(spark: SparkSession, work: str):  # type: ignore[no-untyped-def]
    return (
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


def written(spark: SparkSession, work: str) -> int:
    out = os.path.join(work, "out")
    if not os.path.exists(os.path.join(out, "_spark_metadata")):
        return 0
    return spark.read.schema(spark_connector.SCHEMA).parquet(out).count()


def wait(condition, queries: Queries, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + LIMIT
    while not condition():
        queries.check()
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
    first = Queries(spark, work, rows)
    try:
        wait(lambda: written(spark, work) >= rows // 3, first, "rows in the first session")
    finally:
        spark.stop()  # while both queries run
    end_queries(first.running.values())
    spark = session()
    spark_connector.register(spark, key=key)
    second = Queries(spark, work, rows)

    def writer_done() -> bool:
        progress = second.running["writer"].lastProgress or {}
        return progress.get("sources", [{}])[0].get("endOffset") is not None

    try:
        wait(
            lambda: writer_done() and written(spark, work) >= rows,
            second,
            "every row read in the second session",
        )
    except RuntimeError as exc:
        error = str(exc)
    read = spark.read.schema(spark_connector.SCHEMA).parquet(os.path.join(work, "out"))
    values = [int(r.value) for r in read.select("value").collect()]
    keys = read.select("publisher", "seq").distinct().count()
    for query in second.running.values():
        query.stop()
    spark.stop()
    return {
        "rows": len(values),
        "distinct": keys,
        "values": len(set(values)),
        "in_range": all(0 <= v < rows for v in values),
        "error": error,
        "worker_starts": sum(first.restarts.values()) + sum(second.restarts.values()),
    }


if __name__ == "__main__":
    main()
