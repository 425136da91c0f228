"""A Spark application on local-cluster[2,1,1024] that reads topic `t`, which an `episub
node` outside Spark publishes into, using only documented options: the key and the outside
node's address given to `register`, `startingOffsets=earliest`, a file sink with a
checkpoint. Run twice by tests/test_spark_kills.py on one checkpoint, the first run
SIGKILLed mid-stream.

    outside_reader.py KEY_HEX BOOTSTRAP OUT CHECKPOINT TOTAL

Prints "read N" lines (distinct seqs in the output so far) and, once N reaches TOTAL, one
JSON line {"rows": ..., "distinct": ..., "seqs": [min, max], "publishers": ...} read back
through the file sink's log (so only committed batches count), then exits 0. The "read N"
looks read the files that log lists with pyarrow, here in the driver: a Spark job each
half second would take the executors' two cores from the query it watches.
"""

from __future__ import annotations

import json
import os
import sys
import time
from urllib.parse import urlparse

os.environ["PYSPARK_PYTHON"] = sys.executable

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

import spark_connector

LIMIT = 300.0  # s: the longest the run may take to read everything


def main() -> None:
    key_hex, bootstrap, out, checkpoint, total = sys.argv[1:6]
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .config("spark.ui.enabled", "false")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        spark_connector.register(spark, key=bytes.fromhex(key_hex), bootstrap=[bootstrap])
        query = (
            spark.readStream.format("episub")
            .option("topic", "t")
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        deadline = time.monotonic() + LIMIT
        looked: set[str] = set()  # committed files already read
        seqs: set[int] = set()
        while len(seqs) < int(total):
            if time.monotonic() > deadline or query.exception() is not None:
                raise SystemExit(f"read {len(seqs)} of {total}: {query.exception()}")
            time.sleep(0.5)  # the next look at what the query wrote
            if os.path.exists(os.path.join(out, "_spark_metadata")):
                # The committed files: Spark lists them from the sink's log, running no job.
                written = spark.read.schema(spark_connector.SCHEMA).parquet(out)
                for uri in sorted(set(written.inputFiles()) - looked):
                    looked.add(uri)
                    table = pq.read_table(urlparse(uri).path, columns=["seq"])
                    seqs.update(table.column("seq").to_pylist())
            print(f"read {len(seqs)}", flush=True)
        query.stop()
        rows = spark.read.schema(spark_connector.SCHEMA).parquet(out)
        rows = rows.select("publisher", "seq").collect()
        seqs = [r.seq for r in rows]
        print(
            json.dumps(
                {
                    "rows": len(rows),
                    "distinct": len(set(seqs)),
                    "seqs": [min(seqs), max(seqs)],
                    "publishers": len({r.publisher for r in rows}),
                }
            ),
            flush=True,
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
