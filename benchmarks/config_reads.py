"""What `config.get` costs a UDF that calls it on every row, beside the same UDF without it.

    PY=/work/main/.venv/bin/python
    $PY benchmarks/config_reads.py --rows 20000 --out benchmarks/results/config_reads.json

An embedded local[2] Spark (PYSPARK_PYTHON = this interpreter), the episub deployment and
configuration started on the driver (`threshold` set once), `--rows` rows cached in two
partitions. Two UDFs filter them: `plain` compares each row with a constant, `with_get`
with `config.get("threshold")`. Each is timed `--passes` times, alternately (the first pass
of each also starts the Python workers and, for `with_get`, the executor's agent); the
figures are per row, over the two tasks running side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEY = bytes(32)


def measure(rows: int, passes: int) -> dict[str, Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import col, udf

    import spark_connector

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.PYTHONPATH", str(ROOT))
        .getOrCreate()
    )
    try:
        spark_connector.register(spark, key=KEY)
        cfg = spark_connector.cluster_config(spark)
        cfg.set("threshold", 0.5)
        df = spark.range(rows).repartition(2).cache()
        df.count()

        @udf("boolean")
        def plain(x: int) -> bool:
            return (x % 100) / 100 > 0.5

        @udf("boolean")
        def with_get(x: int) -> bool:
            from spark_connector import config

            return (x % 100) / 100 > config.get("threshold", 0.5)

        timings: dict[str, list[float]] = {"plain": [], "with_get": []}
        kept: dict[str, int] = {}
        for _ in range(passes):
            for name, f in (("plain", plain), ("with_get", with_get)):
                start = time.monotonic()
                kept[name] = df.filter(f(col("id"))).count()
                timings[name].append(time.monotonic() - start)
        if kept["plain"] != kept["with_get"]:
            raise SystemExit(f"the two filters disagree: {kept}")
    finally:
        spark.stop()
    per_row = {k: [round(1e6 * t / rows, 2) for t in v] for k, v in timings.items()}
    best = {k: min(v) for k, v in per_row.items()}
    return {
        "rows": rows,
        "passes": passes,
        "us_per_row": per_row,
        "best_us_per_row": best,
        "get_us_per_row": round(best["with_get"] - best["plain"], 2),
        "kept": kept["plain"],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rows", type=int, default=20_000, help="rows filtered per pass")
    p.add_argument("--passes", type=int, default=3, help="timed passes of each UDF")
    p.add_argument("--out", help="also write the result JSON here")
    args = p.parse_args(argv)
    if args.rows < 1 or args.passes < 1:
        p.error("--rows and --passes must be positive")
    result = measure(args.rows, args.passes)
    result["command"] = shlex.join([Path(sys.executable).as_posix(), "benchmarks/config_reads.py",
                                    *(sys.argv[1:] if argv is None else argv)])  # fmt: skip
    best = result["best_us_per_row"]
    print(f"rows={args.rows}: plain {best['plain']} us/row, with config.get "
          f"{best['with_get']} us/row: config.get costs {result['get_us_per_row']} us a row "
          f"(best of {args.passes})")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
