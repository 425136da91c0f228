"""Live configuration on local-cluster[2,1,1024]: run by tests/test_spark_config.py as its
own OS process; prints its findings as JSON on stdout's last line.

1. The driver sets 100 successive versions while a UDF on each executor follows them.
2. One executor's agent is SIGKILLed; the next task there starts a new agent whose
   replica gets the current snapshot from a neighbour, the driver sending nothing.
3. The driver and an external `episub config set` race on one key; every node converges.
4. A task calls config.get 1,000 times; its executor's agent counts the requests it got,
   and says the retention and the signing `register` gave it.
5. After the application: whether the key shows in Spark's event log (what the UI and the
   history server show), where job properties, cluster_config's among them, are written.
6. The overlay once every node has neighbours with measured RTTs: one node per executor
   plus the driver's (the test then checks that none of them outlives the application).

Every node signs what it publishes (register(signed=True)), the external process too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession
from pyspark.sql.functions import col, udf

import spark_connector
from episub import RetentionConfig
from spark_connector.config import cluster_config
from spark_connector.deployment import driver_client, executor_client, executor_owner

KEY = bytes(range(32))
FINAL = 100
LIMIT = 180.0  # s: the longest any awaited condition may take on a loaded 2-core machine
TOPIC = "_episub.config.default"
READS = 1000  # config.get calls in one task (section 4)
RETENTION = RetentionConfig(max_age=1234.0, max_messages=4321)


def wait(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + LIMIT
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)  # polling other processes' state: there is no event to await


def driver_stats(deployment: spark_connector.Deployment) -> dict[str, int]:
    with driver_client(deployment) as client:
        return client.inspect().stats


def main() -> None:
    with tempfile.TemporaryDirectory() as events:
        spark = (
            SparkSession.builder.master("local-cluster[2,1,1024]")
            .config("spark.ui.enabled", "false")
            .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
            .config("spark.locality.wait", "0")  # two tasks, two executors: no waiting
            .config("spark.eventLog.enabled", "true")
            .config("spark.eventLog.dir", events)
            .config("spark.eventLog.compress", "false")
            .getOrCreate()
        )
        try:
            out = run(spark)
        finally:
            spark.stop()
        logs = [p.read_bytes() for p in Path(events).rglob("*") if p.is_file()]
        out["event_log_bytes"] = sum(map(len, logs))
        out["key_in_event_log"] = any(KEY.hex().encode() in log for log in logs)
    print(json.dumps(out))


def run(spark: SparkSession) -> dict[str, object]:
    # A retention of our own, and signed publishing (section 4 checks every agent has both).
    deployment = spark_connector.register(spark, key=KEY, retention=RETENTION, signed=True)
    cfg = cluster_config(spark)
    sc = spark.sparkContext
    wait(lambda: sc._jsc.sc().getExecutorMemoryStatus().size() == 3, "two executors")
    out: dict[str, object] = {}

    @udf("string")
    def follow(_: int) -> str:
        """Follows the versions on this executor until the last one; reports them."""
        from spark_connector import config

        seen = [config.version()]
        deadline = time.monotonic() + LIMIT
        while seen[-1] < FINAL and time.monotonic() < deadline:
            config.wait_for(seen[-1] + 1, timeout=10.0)
            seen.append(config.version())
        return json.dumps({"owner": executor_owner(), "seen": seen, "values": config.snapshot(),
                           "lag": config.lag()})  # fmt: skip

    def write_versions() -> None:
        with driver_client(deployment) as client:

            def both_executors_follow() -> bool:
                return len(client.inspect().topics.get(TOPIC, [])) >= 2

            wait(both_executors_follow, "both executors' replicas")
        for n in range(1, FINAL + 1):
            cfg.set("n", n)

    failed: list[BaseException] = []

    def write_or_fail() -> None:
        try:
            write_versions()
        except BaseException as exc:
            failed.append(exc)

    writer = threading.Thread(target=write_or_fail)
    writer.start()
    rows = spark.range(0, 2, 1, 2).select(follow(col("id")).alias("r")).collect()
    writer.join()
    if failed:
        raise SystemExit(f"the writer failed: {failed[0]!r}")
    out["followed"] = [json.loads(r.r) for r in rows]
    out["driver_lag"] = cfg.lag()

    # 2. Kill one executor agent; the next task there starts another, which catches up.
    @udf("string")
    def look(_: int) -> str:
        # The executor's agent itself, not this worker's copy of its replica: what the
        # agent's replica holds is the point (a copy could still hold what the killed one had).
        with executor_client(deployment) as client:
            pid = client.inspect().pid
            view = client.config_read("default")
        found = {"owner": executor_owner(), "agent": pid}
        return json.dumps({**found, "version": view.version, "values": view.values})

    def look_everywhere() -> list[dict]:
        """One look per executor (Spark places tasks as it likes: asked again if needed)."""
        found: dict[int, dict] = {}
        for _ in range(10):
            rows = spark.range(0, 2, 1, 2).select(look(col("id")).alias("r")).collect()
            found.update((v["owner"], v) for v in (json.loads(r.r) for r in rows))
            if len(found) == 2:
                break
        return sorted(found.values(), key=lambda v: v["owner"])

    before = look_everywhere()
    victim = before[0]["agent"]
    os.kill(victim, signal.SIGKILL)
    stats_before = driver_stats(deployment)
    after = look_everywhere()
    stats_after = driver_stats(deployment)
    out["restart"] = {
        "before": before,
        "after": after,
        "killed": victim,
        "driver_snapshots_sent": [stats_before.get("config_snapshots_sent", 0),
                                  stats_after.get("config_snapshots_sent", 0)],
        "driver_published": [stats_before["published"], stats_after["published"]],
    }  # fmt: skip

    # 3. The driver and an external process race on one key.
    external = subprocess.Popen(
        [sys.executable, "-m", "episub.cli", "config", "set", "--bootstrap",
         deployment.bootstrap[0], "race=external", "--repeat", "30", "--signed"],
        env={**os.environ, "EPISUB_KEY": KEY.hex()}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    for _ in range(30):
        cfg.set("race", "driver")
    stdout, stderr = external.communicate(timeout=LIMIT)
    if external.returncode != 0:
        raise SystemExit(f"episub config set failed: {stderr}")

    def converged() -> bool:
        target = cfg.version()
        views = look_everywhere()
        out["race"] = {
            "driver": {"version": target, "race": cfg.get("race")},
            "executors": [
                {"version": v["version"], "race": v["values"].get("race")} for v in views
            ],
            "external": json.loads(stdout.strip().splitlines()[-1]),
        }
        return all(v["version"] == target and v["values"].get("race") == cfg.get("race")
                   for v in views)  # fmt: skip

    wait(converged, "the race to converge")

    # 4. config.get per row: served from the worker's copy, not one agent request a row.
    @udf("string")
    def read_per_row(_: int) -> str:
        from spark_connector import config

        config.get("race")  # the worker's first read may ask the agent and start the copy
        with executor_client(deployment) as client:
            before = client.inspect().stats["agent_requests"]
            values = {config.get("race") for _ in range(READS)}
            stats = client.inspect().stats
        retention = [stats["retention_max_age_s"], stats["retention_max_messages"]]
        return json.dumps({"owner": executor_owner(), "values": sorted(values),
                           "requests": stats["agent_requests"] - before,
                           "retention": retention, "signed": stats["signed"]})  # fmt: skip

    rows = spark.range(0, 2, 1, 2).select(read_per_row(col("id")).alias("r")).collect()
    out["reads"] = [json.loads(r.r) for r in rows]
    driver = driver_stats(deployment)
    out["driver_retention"] = [driver["retention_max_age_s"], driver["retention_max_messages"]]
    out["driver_signed"] = driver["signed"]
    out["driver_bad_signatures"] = driver["bad_signatures"]

    # 6. The overlay, once every link has a measured RTT (pings run every second).
    def settled() -> bool:
        views = spark_connector.overlay(spark, deployment)
        out["overlay"] = [dataclasses.asdict(v) for v in views]
        return len(views) == 3 and all(
            v.neighbors and all(n["rtt_ms"] is not None for n in v.neighbors) for v in views
        )

    wait(settled, "every node to have neighbours with measured RTTs")
    return out


if __name__ == "__main__":
    main()
