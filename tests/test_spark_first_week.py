"""What a Spark engineer meets in a first week, in real Spark (local[2]): fixed ports for
the driver's and executors' nodes, `register()` called again in one process, a batch read
of a topic nobody published to, and option mistakes caught where the read is defined.
One SparkSession for the module; the driver's agent is stopped by its pid at the end."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark", reason="the Spark connector needs the spark extra")

from pyspark.sql import SparkSession

import spark_connector
from episub.agent import AgentClient
from episub.net.peer_id import parse_address
from tests.proc_helpers import wait_process_gone

pytestmark = [pytest.mark.timeout(300), pytest.mark.spark]

KEY = bytes(range(32))


def _free_ports(count: int) -> list[int]:
    """`count` consecutive ports that nothing listens on now (bound and closed again)."""
    for _ in range(100):
        base = random.randrange(20000, 60000 - count)
        try:
            for port in range(base, base + count):
                with socket.create_server(("127.0.0.1", port)):
                    pass
        except OSError:
            continue
        return list(range(base, base + count))
    raise AssertionError("no free port range")


PORTS = _free_ports(4)  # the driver's, then the executors' range


def _a_session_stopped_before() -> set[int]:
    """A session before this module's, with other node settings (no fixed ports), whose
    write starts its executors' nodes. It is stopped and its driver's node with it, as
    each module of this suite does; its executors' nodes run on in the JVM the next
    session gets. Returns their agents' pids."""
    first = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
    session = first.getOrCreate()
    deployment = spark_connector.register(session, key=KEY)
    df = session.createDataFrame([(b"first try",)], "value binary")
    df.write.format("episub").option("topic", "ports").mode("append").save()
    pids = {v.pid for v in spark_connector.overlay(session) if v.role == "executor"}
    session.stop()
    with AgentClient(deployment.driver_socket) as client:
        driver = client.inspect().pid
    os.kill(driver, signal.SIGTERM)
    wait_process_gone(driver, timeout=60)
    return pids


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    first_try = _a_session_stopped_before()
    assert first_try
    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.episub.executorPorts", f"{PORTS[1]}-{PORTS[3]}")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    for pid in first_try:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


@pytest.fixture(scope="module")
def deployment(spark: SparkSession) -> Iterator[spark_connector.Deployment]:
    deployment = spark_connector.register(spark, key=KEY, port=PORTS[0])
    yield deployment
    # Every agent this module started, executors' too: their owner, this process's JVM,
    # lives on into the next module, whose executors would otherwise find them (started
    # on this module's fixed ports and settings) instead of starting their own.
    pids = {view.pid for view in spark_connector.overlay(spark)}
    with AgentClient(deployment.driver_socket) as client:
        pids.add(client.inspect().pid)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)


def test_the_nodes_listen_on_the_configured_ports(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    """Also after a session with other executor settings ran in the same JVM: its
    executors' nodes are still running there, and this session's tasks start their own."""
    assert deployment.bootstrap == (f"127.0.0.1:{PORTS[0]}",)
    df = spark.createDataFrame([(b"v%d" % i,) for i in range(10)], "value binary")
    df.write.format("episub").option("topic", "ports").mode("append").save()
    views = spark_connector.overlay(spark)
    assert views[0].role == "driver" and views[0].address == f"127.0.0.1:{PORTS[0]}"
    executors = [v for v in views if v.role == "executor"]
    assert executors, views
    for view in executors:
        assert PORTS[1] <= parse_address(view.address).port <= PORTS[3], view.address


def test_register_again_reuses_the_running_node_and_its_key(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    again = spark_connector.register(spark)
    assert again.key == deployment.key and again.bootstrap == deployment.bootstrap
    df = spark.createDataFrame([(b"after",)], "value binary")
    df.write.format("episub").option("topic", "again").mode("append").save()
    rows = spark.read.format("episub").option("topic", "again").load().collect()
    assert [r.value for r in rows] == [b"after"]


@pytest.mark.parametrize(
    ("arguments", "named"),
    [({"key": bytes(32)}, "key"), ({"port": PORTS[0] + 100}, "port"), ({"signed": True}, "signed")],
)
def test_register_again_with_a_conflicting_setting_is_refused_in_one_line(
    spark: SparkSession,
    deployment: spark_connector.Deployment,
    arguments: dict[str, object],
    named: str,
) -> None:
    with pytest.raises(ValueError, match=f"runs already with another {named}") as raised:
        spark_connector.register(spark, **arguments)  # type: ignore[arg-type]
    assert "\n" not in str(raised.value)


def test_a_batch_read_of_a_topic_nobody_published_to_is_empty(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    df = spark.read.format("episub").option("topic", "nobody-wrote-here").load()
    assert df.collect() == []


def test_a_misspelt_option_fails_at_load_with_the_spelling_to_use(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    reader = spark.readStream.format("episub").option("topic", "t")
    with pytest.raises(Exception, match='did you mean "startingOffsets"') as raised:
        reader.option("startingOffset", "earliest").load()  # load(), before any start()
    assert "UnboundLocalError" not in str(raised.value)
    with pytest.raises(Exception, match='option "maxOffsetsPerTrigger" must be a whole number'):
        spark.readStream.format("episub").option("topic", "t").option(
            "maxOffsetsPerTrigger", "many"
        ).load()
