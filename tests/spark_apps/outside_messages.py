"""Many one-row messages held by a node outside Spark, read by Spark: a batch read and an
`availableNow` stream, each row checked to come exactly once.

    .venv/bin/python tests/spark_apps/outside_messages.py --rows 1000000
    .venv/bin/python tests/spark_apps/outside_messages.py --rows 30000 --master 'local[2]'

An `episub node` process (topic `t`, its agent socket) publishes --rows rows of --size
bytes, one row per message, in requests of 1,000 messages, as fast as it takes them: the
publish rate is rows over that time. Spark (--master, default local-cluster[2,1,1024]) is
started after, with `register(spark, bootstrap=[that node])`, so the outside node is the
only node that holds the rows when the reads begin. Then `spark.read.format("episub")`
(collecting seq to the driver as Arrow) and `readStream ... trigger(availableNow=True)` into a
parquet sink, read back. Read rate = rows over the read's wall time (a job's planning
included, the session's start not).

Prints one JSON line and writes it to --out (default benchmarks/results/outside_messages.json):
{"rows", "publish_rows_per_s", "batch": {"rows_per_s", "distinct", "rows"},
"stream": {...}, "load_before", "load_after" (1-minute load averages), "command"}.
Exit status 1 when a read failed or a row is missing or repeated.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

KEY = bytes(range(32))
TOPIC = "t"
PUBLISH_CHUNK = 1_000  # messages per publish request: one row each


def retention(rows: int, size: int) -> dict[str, float]:
    """Room for every row on every node (the default keeps 100,000 messages)."""
    return {"max_messages": rows, "max_bytes": rows * (size + 200), "max_age": 3600.0}


def start_outside_node(work: Path, rows: int, size: int) -> tuple[subprocess.Popen[str], str, str]:
    """An `episub node` in topic `t` keeping `rows` messages, its agent socket under
    `work`; (process, address, socket path) once it listens."""
    socket_path = str(work / "outside.sock")
    config = work / "outside.json"
    config.write_text(json.dumps({"retention": retention(rows, size)}))
    with open(work / "outside.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "episub.cli", "node", "--listen", "127.0.0.1:0",
             "--topic", TOPIC, "--socket", socket_path, "--config", str(config)],
            stdout=subprocess.PIPE, stderr=log, text=True,
            env={**os.environ, "EPISUB_KEY": KEY.hex()},
        )  # fmt: skip
    assert proc.stdout is not None
    words = proc.stdout.readline().split()  # "episub node ID listening on ADDRESS ..."
    if words[3:5] != ["listening", "on"]:
        proc.kill()
        raise SystemExit(f"the outside node did not start: {words!r}")
    return proc, words[5], socket_path


def publish(socket_path: str, rows: int, size: int) -> float:
    """Publish rows 0..rows-1 (the row's number, padded to `size` bytes), one a message;
    returns rows/s."""
    from episub.agent import AgentClient

    pad = b"x" * size
    started = time.monotonic()
    with AgentClient(socket_path, timeout=60.0) as client:
        for low in range(0, rows, PUBLISH_CHUNK):
            high = min(rows, low + PUBLISH_CHUNK)
            client.publish_batch(TOPIC, [(b"%d " % i + pad)[:size] for i in range(low, high)])
    return rows / (time.monotonic() - started)


def check(frame: Any, rows: int) -> dict[str, int | bool]:
    """Each of seqs 0..rows-1 once in `frame`'s seq column, collected to the driver as
    Arrow: a Python Row per seq would cost the driver more than the read it checks."""
    import numpy as np

    seqs = np.sort(frame.select("seq").toArrow().column("seq").to_numpy())
    return {
        "rows": len(seqs),
        "distinct": len(np.unique(seqs)),
        "exact": bool(np.array_equal(seqs, np.arange(rows))),
    }


def warm_up(spark: Any) -> float:
    """Spark's own first-job costs, paid before any read is timed: a job of one Arrow
    Python task per executor (JVM code generation, each executor's Python worker started),
    touching no episub node. Returns its seconds (in the JSON as spark_warmup_s)."""
    started = time.monotonic()
    executors = max(1, spark.sparkContext.defaultParallelism)
    spark.range(0, executors, 1, executors).mapInArrow(lambda batches: batches, "id long").count()
    return round(time.monotonic() - started, 2)


def read(master: str, address: str, rows: int, size: int, work: Path) -> dict[str, object]:
    from pyspark.sql import SparkSession

    import spark_connector
    from episub.proto.store import RetentionConfig

    spark = (
        SparkSession.builder.master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    out: dict[str, object] = {"spark_warmup_s": warm_up(spark)}
    try:
        spark_connector.register(
            spark,
            key=KEY,
            bootstrap=[address],
            retention=RetentionConfig(**retention(rows, size)),  # type: ignore[arg-type]
        )
        started = time.monotonic()
        try:
            frame = spark.read.format("episub").option("topic", TOPIC).load()
            found = check(frame, rows)
            took = time.monotonic() - started
            out["batch"] = {**found, "rows_per_s": round(int(found["rows"]) / took)}
        except Exception as exc:  # the figure is the failure: reported, and the exit says so
            out["batch"] = {"error": str(exc)[-2000:]}
        sink = work / "stream"
        started = time.monotonic()
        try:
            query = (
                spark.readStream.format("episub")
                .option("topic", TOPIC)
                .option("startingOffsets", "earliest")
                .load()
                .select("seq")
                .writeStream.format("parquet")
                .option("path", str(sink))
                .option("checkpointLocation", str(work / "checkpoint"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            took = time.monotonic() - started
            found = check(spark.read.parquet(str(sink)), rows)
            out["stream"] = {**found, "rows_per_s": round(int(found["rows"]) / took)}
        except Exception as exc:
            out["stream"] = {"error": str(exc)[-2000:]}
    finally:
        spark.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes")
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    parser.add_argument("--out", default="benchmarks/results/outside_messages.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="episub-outside-") as directory:
        work = Path(directory)
        node, address, socket_path = start_outside_node(work, args.rows, args.size)
        try:
            # The 1-minute load average before and after: the machine is shared, and the
            # rates move with what else runs on it.
            result: dict[str, object] = {"rows": args.rows, "size": args.size}
            result["load_before"] = round(os.getloadavg()[0], 2)
            result["publish_rows_per_s"] = round(publish(socket_path, args.rows, args.size))
            result.update(read(args.master, address, args.rows, args.size, work))
        finally:
            node.terminate()
            node.wait(timeout=30)
    result["load_after"] = round(os.getloadavg()[0], 2)
    result["master"] = args.master
    result["command"] = " ".join(["tests/spark_apps/outside_messages.py", *sys.argv[1:]])
    line = json.dumps(result)
    print(line, flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n")
    ok = all(
        isinstance(result.get(k), dict) and result[k].get("exact")  # type: ignore[union-attr]
        for k in ("batch", "stream")
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
