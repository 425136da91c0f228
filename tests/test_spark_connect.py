"""The connector from a Spark Connect client (issue 17), against a real Connect server from
the pip package on local[2] (tests/connect_server.py): one server and one client session
for the module. The client is this process; the server, its planners, executors and
episub agents are other processes, and the fixture checks that every agent the server's
side started ends with the server.

The key is drawn at random for the run, so that finding it anywhere means it leaked."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark connector needs the spark extra")
pytest.importorskip("grpc", reason="a Spark Connect client needs pyspark[connect]'s extras")

from pyspark.sql import SparkSession
from pyspark.sql.functions import col, current_timestamp, udf

import spark_connector
from spark_connector.connect import SESSION_CONF
from spark_connector.deployment import agent_dir
from tests.connect_server import ConnectServer, agent_processes, argument
from tests.proc_helpers import wait_until

pytestmark = [pytest.mark.timeout(600), pytest.mark.spark]

KEY = os.urandom(32)
LIMIT = 120.0  # s: the longest any awaited condition may take on a loaded 2-core machine
EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.fixture(scope="module")
def server() -> Iterator[ConnectServer]:
    # Short: agent sockets go under it, and a socket path has at most 107 bytes.
    directory = Path(tempfile.mkdtemp(prefix="ep-connect-", dir="/tmp"))
    server = ConnectServer(directory)
    try:
        yield server
    finally:
        left = server.stop()
        # Executors' agents remove their deployment's kept copy (the key) with the server.
        kept = [p.name for p in server.agent_dir.glob("*.deployment")]
        shutil.rmtree(directory, ignore_errors=True)
        assert not left, f"episub agents outlived the Connect server: {left}"
        assert not kept, f"copies of the deployment outlived the Connect server: {kept}"


@pytest.fixture(scope="module")
def spark(server: ConnectServer) -> Iterator[SparkSession]:
    session = SparkSession.builder.remote(server.url).getOrCreate()
    try:
        yield session
    finally:
        session.stop()
        # builder.remote() marks the whole process as a Connect client; the modules after
        # this one start classic sessions, and their children inherit the environment.
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


@pytest.fixture(scope="module")
def deployment(spark: SparkSession) -> spark_connector.Deployment:
    return spark_connector.register(spark, key=KEY)


def test_the_driver_node_runs_beside_the_server_owned_by_it_and_none_in_the_client(
    server: ConnectServer, deployment: spark_connector.Deployment
) -> None:
    assert deployment.driver_pid == server.pid
    assert deployment.driver_socket.startswith(str(server.agent_dir))
    owners = {pid: argument(args, "--owner-pid") for pid, args in server.agents().items()}
    assert owners, "no agent runs beside the server"
    assert set(owners.values()) == {str(server.pid)}, owners
    ours = [
        pid
        for pid, args in agent_processes().items()
        if argument(args, "--owner-pid") == str(os.getpid())
    ]
    assert not ours, f"agents owned by the client process: {ours}"
    assert not list(Path(agent_dir()).glob(f"*{deployment.id}*")), "a socket beside the client"


def test_a_connect_client_runs_the_quickstart_pipeline_and_reads_each_message_once(
    spark: SparkSession, deployment: spark_connector.Deployment, server: ConnectServer
) -> None:
    count = 300
    reading = (
        spark.readStream.format("episub")
        .option("topic", "events")
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("memory")
        .queryName("connect_events")
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        publish = subprocess.run(
            [sys.executable, "-m", "episub.cli", "publish", "--bootstrap",
             deployment.bootstrap[0], "--topic", "events", "--count", str(count),
             "--size", "32", "--summary"],
            env={**os.environ, "EPISUB_KEY": KEY.hex()}, capture_output=True, text=True,
            timeout=LIMIT, check=False,
        )  # fmt: skip
        assert publish.returncode == 0, publish.stderr
        writing = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", count)
            .load()
            .selectExpr("concat('from Spark ', value) as value")
            .writeStream.format("episub")
            .option("topic", "events")
            .option("checkpointLocation", str(server.dir / "sink-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert writing.awaitTermination(LIMIT), "the sink query did not finish"
        assert writing.exception() is None

        def all_read() -> bool:
            reading.processAllAvailable()
            return spark.sql("select count(*) n from connect_events").first().n >= 2 * count

        wait_until(all_read, LIMIT, f"{2 * count} rows")  # each look runs a query step
    finally:
        reading.stop()
    rows = spark.sql("select publisher, seq, cast(value as string) v from connect_events")
    rows = rows.collect()
    assert len(rows) == 2 * count
    assert len({(r.publisher, r.seq) for r in rows}) == 2 * count
    sunk = sorted(r.v for r in rows if r.publisher.startswith("sink/"))
    assert sunk == sorted(f"from Spark {i}" for i in range(count))
    published = [r for r in rows if not r.publisher.startswith("sink/")]
    assert len({r.publisher for r in published}) == 1
    assert sorted(r.seq for r in published) == list(range(count))


# No type hints: with them PySpark tries to infer a pandas UDF, and warns.
def threshold_seen(_):  # type: ignore[no-untyped-def]
    from spark_connector import config

    return config.get("threshold", -1)


def test_a_config_value_set_while_a_query_runs_reaches_its_udf_in_a_later_batch(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    seen = udf(threshold_seen, "long")  # made here: a UDF is a Connect one once a session is
    cfg = spark_connector.cluster_config(spark)
    first = cfg.set("threshold", 10)
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 20)
        .load()
        # current_timestamp() is the micro-batch's time: one value per batch.
        .select(current_timestamp().alias("batch"), seen(col("value")).alias("seen"))
        .writeStream.format("memory")
        .queryName("connect_thresholds")
        .trigger(processingTime="500 milliseconds")
        .start()
    )

    def batches() -> list[set[int]]:
        rows = spark.sql("select batch, collect_set(seen) s from connect_thresholds group by batch")
        return [set(r.s) for r in sorted(rows.collect(), key=lambda r: r.batch)]

    try:
        wait_until(lambda: {10} in batches(), LIMIT, "a batch under threshold 10")
        second = cfg.set("threshold", 42)
        wait_until(lambda: batches()[-1] == {42}, LIMIT, "a batch under threshold 42")
    finally:
        query.stop()
    history = batches()
    assert history[0] == {10}, history
    changed = next(i for i, s in enumerate(history) if 42 in s)
    assert all(s == {42} for s in history[changed + 1 :]), history  # never back to 10
    assert second > first
    assert cfg.get("threshold") == 42 and cfg.version() >= second
    # Outside tasks, on the client, the module's reads go to the driver's node too.
    assert spark_connector.config.get("threshold") == 42
    assert spark_connector.config.wait_for(second, timeout=1.0)
    with pytest.raises(spark_connector.ConfigError, match="Spark Connect client has none"):
        spark_connector.config.watch(print)


def read_threshold_in_foreach_batch(frame, batch_id):  # type: ignore[no-untyped-def]
    """Runs in a Python process of the server (Connect runs foreachBatch there), where
    `register` never ran: it finds the driver's node through the session."""
    from spark_connector import config

    seen = frame.sparkSession.createDataFrame(
        [(batch_id, config.get("threshold"))], "b long, t long"
    )
    seen.write.mode("append").saveAsTable("connect_foreach_batch")


def test_foreach_batch_code_reads_the_configuration_from_the_driver_node(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    spark_connector.cluster_config(spark).set("threshold", 42)
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 5)
        .load()
        .writeStream.foreachBatch(read_threshold_in_foreach_batch)
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:

        def reported() -> bool:
            if (error := query.exception()) is not None:
                raise AssertionError(f"the foreachBatch query failed: {error}")
            return spark.catalog.tableExists("connect_foreach_batch")

        wait_until(reported, LIMIT, "a batch's report")
    finally:
        query.stop()
    assert query.exception() is None
    assert {r.t for r in spark.table("connect_foreach_batch").collect()} == {42}


def test_overlay_from_the_client_shows_the_driver_node_and_the_executor_node(
    spark: SparkSession, deployment: spark_connector.Deployment, server: ConnectServer
) -> None:
    views = spark_connector.overlay(spark, deployment)
    assert [v.role for v in views] == ["driver", "executor"]
    assert views[0].address == deployment.bootstrap[0]
    assert {v.pid for v in views} <= set(server.agents())
    assert views[0].address in {n["address"] for n in views[1].neighbors}


def key_forms(key: bytes) -> list[bytes]:
    """The ways a 32-byte key could be written out: raw, hex (either case, spaced as Spark
    shows binary), base64 (either alphabet), Python's repr."""
    spaced = " ".join(f"{b:02X}" for b in key)
    return [
        key,
        key.hex().encode(),
        key.hex().upper().encode(),
        spaced.encode(),
        base64.b64encode(key),
        base64.urlsafe_b64encode(key),
        repr(key)[2:-1].encode(),
    ]


def test_the_key_shows_in_no_plan_configuration_or_log_line(
    spark: SparkSession,
    deployment: spark_connector.Deployment,
    server: ConnectServer,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Runs after the tests above, so the server's logs hold their runs too."""
    source = spark.readStream.format("episub").option("topic", "events").load()
    for mode in ("simple", "extended", "codegen", "cost", "formatted"):
        source.explain(mode=mode)
    query = (
        source.writeStream.format("episub")
        .option("topic", "copied")
        .option("checkpointLocation", str(server.dir / "copy-checkpoint"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        query.explain(extended=True)
    finally:
        query.stop()
    spark.sql("SET").show(1000, truncate=False)
    conf = spark.conf.getAll
    print(conf)
    printed = capfd.readouterr()
    assert "StreamingRelation" in printed.out, "the plans were not printed"
    assert json.loads(conf[SESSION_CONF])["key_hex"] == ""  # the public form, seen by tasks
    texts = {"the client's output": (printed.out + printed.err).encode()}
    texts["spark.conf.getAll"] = json.dumps(conf).encode()
    logs = [p for p in server.log_files() if p.is_file()]
    assert any("eventlog" in str(p) for p in logs), "no event log was written"
    texts.update({str(p): p.read_bytes() for p in logs})
    for where, text in texts.items():
        for form in key_forms(KEY):
            assert form not in text, f"the key shows in {where} (as {form[:6]!r}...)"
    # The search finds the key where it is meant to be: the copy an executor keeps beside
    # its agent, readable by this user only (deployment.py).
    [kept] = server.agent_dir.glob(f"exec-*-{deployment.id}.deployment")
    assert kept.stat().st_mode & 0o777 == 0o600
    assert any(form in kept.read_bytes() for form in key_forms(KEY))


def test_the_quickstart_takes_remote_and_reads_all_ten_messages(server: ConnectServer) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"}
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), "--remote", server.url],
        capture_output=True, text=True, timeout=3 * LIMIT, env=env, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "read 10 messages from topic 'events'" in run.stdout


def test_a_driver_node_restarted_beside_the_server_loses_nothing_of_a_running_query(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    """Issue 15 under Connect: the driver's node, restarted on its address with no history
    (killed here; retired when idle, in life), made the next latestOffset raise
    DataLossError while the executor's node and the publisher's held the rows. After the
    tests that need the overlay whole: the restarted node is in the cluster topic again
    only once the executors' nodes find it (their recovery, episub/proto/membership.py)."""
    from episub.agent import AgentClient

    topic = "connect-forgetful"
    query = (
        spark.readStream.format("episub")
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "40")
        .load()
        .writeStream.format("memory")
        .queryName("connect_forgetful")
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    outside_socket = str(Path(deployment.driver_socket).parent / "outside-forgetful.sock")
    publisher = subprocess.Popen(
        [sys.executable, "-m", "episub.cli", "node", "--listen", "127.0.0.1:0",
         "--bootstrap", deployment.bootstrap[0], "--topic", topic,
         "--socket", outside_socket],
        env={**os.environ, "EPISUB_KEY": KEY.hex()}, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert publisher.stdout is not None and "listening" in publisher.stdout.readline()
        with AgentClient(outside_socket) as outside:
            outside.publish_batch(topic, [b"%d" % i for i in range(200)])
        wait_until(
            lambda: spark.sql("select count(*) n from connect_forgetful").first().n > 0,
            LIMIT,
            "a first batch",
        )
        with AgentClient(deployment.driver_socket) as client:
            agent = client.inspect().pid
        os.kill(agent, signal.SIGKILL)  # a planner starts it again, on the same address

        def all_read() -> bool:
            assert query.exception() is None, query.exception()
            return spark.sql("select count(*) n from connect_forgetful").first().n >= 200

        wait_until(all_read, LIMIT, "every row after the driver's node restarted")
    finally:
        query.stop()
        publisher.send_signal(signal.SIGTERM)
        publisher.wait(timeout=30)
    rows = spark.sql("select seq from connect_forgetful").collect()
    assert sorted(r.seq for r in rows) == list(range(200))
    with AgentClient(deployment.driver_socket) as client:
        assert client.inspect().address == deployment.driver_address


def test_signing_rides_with_the_deployment_to_the_nodes_beside_the_server(
    spark: SparkSession,
) -> None:
    """A field of the deployment reaches the server's side with no code of its own: a
    second register (last in the module: it replaces the session's data sources)."""
    signed = spark_connector.register(spark, signed=True)
    views = spark_connector.overlay(spark, signed)
    assert [v.role for v in views] == ["driver", "executor"]
    assert [v.stats["signed"] for v in views] == [1, 1]
