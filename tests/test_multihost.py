"""The connector on a Spark standalone cluster of emulated hosts (tests/netcluster.py): the
driver and the master on a bridge, WORKERS worker hosts with their own network and pid
namespaces and temporary directories, one 1-core executor each, one SparkSession for the
module. What loopback cannot show: pids that repeat across hosts, temporary directories
that differ, links that go down.

Needs root (namespaces); skips with the reason elsewhere. The tests run in file order:
the first pins the executors' agents to one pid, before other tests' tasks start them.

The 60 s and the 20 s cut run once each in the suite; on demand, each as many times as
EPISUB_CUT_RUNS says, on the module's one cluster (about 100 s and 40 s a run, after a
minute or two building the cluster):

    EPISUB_ONDEMAND=1 EPISUB_CUT_RUNS=5 .venv/bin/python -m pytest -q -s \\
        tests/test_multihost.py -k 60s
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the Spark connector needs the spark extra")

from episub.agent import AgentClient, AgentError, AgentWaitExpired
from tests.connect_server import agent_processes, argument
from tests.netcluster import DRIVER_ADDRESS, Host, NetCluster, leftovers, unavailable
from tests.proc_helpers import KEY, wait_process_gone, wait_until

pytestmark = [pytest.mark.timeout(900), pytest.mark.spark]

# Two worker hosts, not three: the suite shares two cores, and every host costs a worker
# JVM, an executor JVM, Python workers and an agent. Two already give pids that repeat,
# a host to cut off and one that stays.
WORKERS = 2
START_LIMIT = 240.0  # s: executors registering with the driver on a loaded 2-core machine
QUERY_LIMIT = 240.0  # s: a stream catching up after a cut (TCP retries back off to ~1 min)
CONFIG_CATCH_UP = 10.0  # s after the link's return: the cut-off host holds the driver's values
ROWS_PER_FILE = 20
# How many times each cut runs on demand, on the module's one cluster.
CUT_RUNS = int(os.environ.get("EPISUB_CUT_RUNS", "1"))
WORKER_START_FAILED = "Python worker failed to connect back"  # Spark's fixed 10 s start limit
WORKER_START_RETRIES = 3  # per query (Supervised): past it, the test fails with the error


class ClusterSession:
    """The module's SparkSession on the cluster, which a test may stop and start again."""

    def __init__(self, cluster: NetCluster, directory: Path) -> None:
        self.cluster = cluster
        self.dir = directory
        self.spark: Any = None
        self.deployment: Any = None

    def start(self) -> None:
        from pyspark.sql import SparkSession

        import spark_connector

        self.spark = (
            SparkSession.builder.master(self.cluster.master_url)
            .appName("episub-multihost")
            .config("spark.driver.host", DRIVER_ADDRESS)
            .config("spark.driver.bindAddress", DRIVER_ADDRESS)
            .config("spark.executor.memory", "512m")
            .config("spark.executor.cores", "1")
            .config("spark.cores.max", str(WORKERS))
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.local.dir", str(self.dir))
            .config("spark.sql.streaming.stopTimeout", "60s")
            # The driver drops an executor silent for spark.network.timeout (120 s); after a
            # 60 s cut, TCP's retransmission backoff may keep it silent ~40 s longer.
            .config("spark.network.timeout", "300s")
            .getOrCreate()
        )
        sc = self.spark.sparkContext
        wait_until(
            lambda: sc._jsc.sc().getExecutorMemoryStatus().size() - 1 >= WORKERS,
            START_LIMIT,
            f"{WORKERS} executors registered\n{self.cluster.log_tails()}",
        )
        self.deployment = spark_connector.register(self.spark, key=KEY)

    def stop(self) -> None:
        """`spark.stop()`, then the session's queries stopped and ended: Spark leaves them
        running, and a reader with no new rows runs no job to fail on the stopped context;
        it goes on planning on its checkpoint beside a restarted query."""
        if self.spark is None:
            return
        queries = self.spark.streams.active
        self.spark.stop()
        self.spark = None
        for query in queries:
            with contextlib.suppress(Exception):  # marked stopped, then its job cancel fails
                query.stop()
        for query in queries:
            try:
                ended = query.awaitTermination(QUERY_LIMIT)
            except Exception:  # it ended with an error (a job on the stopped context)
                ended = True
            assert ended, f"a query of the stopped session still runs: {query.name}"

    def end_gateway(self) -> None:
        """End the JVM this module started. PySpark keeps one JVM a process, and the
        configuration it was launched with (the driver's address on the cluster's bridge)
        stays its default: a later module's session would bind to an address gone."""
        from pyspark import SparkContext

        gateway = SparkContext._gateway
        if gateway is None:
            return
        proc = getattr(gateway, "proc", None)
        gateway.shutdown()
        if proc is not None:
            proc.terminate()
            proc.wait(60)
        SparkContext._gateway = None
        SparkContext._jvm = None

    def end_driver_agent(self) -> None:
        """The driver's agent: its owner, this test process, lives on past the module. The
        process's configuration copies go first: their threads reach the driver's agent as
        planners do, starting it again if it is gone (a later module would find it)."""
        if self.deployment is None:
            return
        from spark_connector import config as cluster_config

        with cluster_config._lock:
            followers = list(cluster_config._followers.values())
            cluster_config._followers.clear()
        for follower in followers:
            follower.stop()
        try:
            with AgentClient(self.deployment.driver_socket, timeout=10.0) as client:
                pid = client.inspect().pid
        except OSError:
            return  # already gone
        os.kill(pid, signal.SIGTERM)
        wait_process_gone(pid)


@pytest.fixture(scope="module")
def cluster() -> Iterator[NetCluster]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    directory = Path(tempfile.mkdtemp(prefix="epnc-", dir="/tmp"))  # short: socket paths
    built = NetCluster(directory, WORKERS)
    try:
        with built:
            yield built
        assert not leftovers(), leftovers()
        assert not built.stragglers, f"processes left in the hosts: {built.stragglers}"
    finally:
        # A Spark planner process that outlived the session may have started the driver's
        # agent again after the session's teardown ended it: it goes with the directory.
        for pid in agents_under(directory):
            os.kill(pid, signal.SIGTERM)
            wait_process_gone(pid)
        shutil.rmtree(directory, ignore_errors=True)


def agents_under(directory: Path) -> list[int]:
    """The episub agents whose sockets are under `directory`."""
    prefix = str(directory) + os.sep
    return [
        pid
        for pid, args in agent_processes().items()
        if (argument(args, "--socket") or "").startswith(prefix)
    ]


@pytest.fixture(scope="module")
def session(cluster: NetCluster) -> Iterator[ClusterSession]:
    # The driver's host has a temporary directory of its own too, so that a socket an
    # executor put there (the driver's path, shipped) would show.
    driver_tmp = cluster.dir / "driver-tmp"
    driver_tmp.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(driver_tmp))
        patch.setenv("TMPDIR", str(driver_tmp))
        # What executors run Python with: PySpark reads it from the driver's environment.
        patch.setenv("PYSPARK_PYTHON", sys.executable)
        started = ClusterSession(cluster, cluster.dir / "spark")
        try:
            started.start()
            yield started
        finally:
            started.stop()
            started.end_driver_agent()
            started.end_gateway()


# -- helpers ----------------------------------------------------------------------------------


def live_agent_socket(host: Host) -> Path:
    """The socket of the one executor agent answering on `host`."""
    answering = []
    for path in sorted(host.agent_dir.glob("exec-*.sock")):
        try:
            with AgentClient(str(path), timeout=5.0) as client:
                client.inspect()
        except (OSError, AgentError):
            continue
        answering.append(path)
    assert len(answering) == 1, f"{host.name}: agents answering at {answering}"
    return answering[0]


def ids_of(values: list[bytes | str]) -> list[int]:
    return sorted(int((v.decode() if isinstance(v, bytes) else v).split(":")[0]) for v in values)


class Feeder:
    """JSON files of ids for a file-source stream: written whole (renamed into place, as
    the file source expects), ROWS_PER_FILE ids each, numbered on."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir()
        self.written = 0

    def write(self) -> None:
        rows = range(self.written, self.written + ROWS_PER_FILE)
        staging = self.dir / f".{self.written}.json.tmp"  # hidden: the source skips it
        staging.write_text("".join(json.dumps({"id": i}) + "\n" for i in rows))
        os.replace(staging, self.dir / f"{self.written:08d}.json")
        self.written += ROWS_PER_FILE

    def for_seconds(self, seconds: float) -> None:
        """A file a second (the writer stream's pace, not a wait for anything)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.write()
            time.sleep(1.0)


def writer_stream(spark: Any, source: Path, topic: str, checkpoint: Path) -> Any:
    from pyspark.sql import functions as F

    return (
        spark.readStream.schema("id long")
        # A file a second: a batch takes one or two, and the backlog of a cut (a file per
        # second of it) drains in a few batches, not in one per two files (a minute).
        .option("maxFilesPerTrigger", 20)
        .json(str(source))
        .select(F.col("id").cast("string").alias("value"))
        .writeStream.format("episub")
        .option("topic", topic)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )


def reader_frame(spark: Any, topic: str) -> Any:
    return (
        spark.readStream.format("episub")
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("cast(value as string) as value")
    )


class Supervised:
    """A query, started again from its checkpoint (as a supervisor would) when it ended on
    Spark's start limit for the Python process that plans it: Spark 4.3 gives that process
    a fixed 10 s to connect back (PythonWorkerFactory.createSimpleWorker; no configuration
    raises it), which a loaded 2-core machine sometimes exceeds. Any other error fails.
    (A memory sink started again starts empty: its rows from before would be missing.)"""

    def __init__(self, start: Callable[[], Any], what: str) -> None:
        self.start = start
        self.what = what
        self.query = start()
        self.restarts = 0

    def check(self) -> None:
        error = self.query.exception()
        if error is None:
            return
        if WORKER_START_FAILED in str(error) and self.restarts < WORKER_START_RETRIES:
            self.restarts += 1
            print(f"{self.what} hit Spark's worker start limit; started again")
            self.query = self.start()
            return
        raise AssertionError(f"{self.what} failed: {error}")

    def process_all_available(self) -> None:
        while True:
            try:
                self.query.processAllAvailable()
            except Exception:
                if self.query.exception() is None:
                    raise
                self.check()  # the query ended: its error decides
                continue
            self.check()
            return


def wait_rows(query: Supervised, count: Any, expected: int) -> None:
    def reached() -> bool:
        query.check()
        return count() >= expected

    wait_until(reached, QUERY_LIMIT, f"{query.what}: {expected} rows")
    query.process_all_available()  # and whatever more there is: a duplicate would show


def stop_all(*queries: Any) -> None:
    for query in queries:
        if isinstance(query, Supervised):
            query = query.query
        if query is not None and query.isActive:
            query.stop()


# -- the tests ---------------------------------------------------------------------------------


def test_overlay_lists_every_executor_node_when_their_agents_share_a_pid(
    session: ClusterSession, cluster: NetCluster
) -> None:
    """Each host has its own pid namespace, so agents on two hosts may have one pid (as in
    containers). Each executor's agent is started here at the same pid on every host (by
    its pid namespace's `ns_last_pid`), then `overlay()` must still list every node."""
    import spark_connector

    spark, deployment = session.spark, session.deployment
    pids: dict[str, int] = {}
    for attempt in range(5):  # another process may take the pid first: try another one
        target = 20_000 + 1_000 * attempt
        rows = (
            spark.sparkContext.parallelize(range(WORKERS), WORKERS)
            .barrier()  # every task at once: one on each executor (1 core each)
            .mapPartitions(lambda _, target=target: [start_agent_at(deployment, target)])
            .collect()
        )
        pids = dict(rows)
        if len(pids) == WORKERS and len(set(pids.values())) == 1:
            break
    assert len(pids) == WORKERS and len(set(pids.values())) == 1, f"no shared pid: {pids}"

    views = spark_connector.overlay(spark)
    executors = [v for v in views if v.role == "executor"]
    assert [v.role for v in views] == ["driver"] + ["executor"] * WORKERS, views
    assert {v.address.rsplit(":", 1)[0] for v in executors} == {h.address for h in cluster.hosts}
    assert {v.pid for v in executors} == set(pids.values())
    assert len({v.node_id for v in views}) == len(views)


def start_agent_at(deployment: Any, target: int) -> tuple[str, int]:
    """In a task: this executor's agent, started again so that its process gets pid
    `target` + 1 in this host's pid namespace (the launcher's process takes `target`, the
    agent is its fork). Returns (this host's address, the agent's pid)."""
    from episub.agent import AgentUnavailable
    from spark_connector.deployment import (
        agent_dir,
        executor_client,
        executor_owner,
        executor_socket_path,
        local_address_toward,
    )

    path = executor_socket_path(agent_dir(), executor_owner(), deployment.executor_name())
    try:
        with AgentClient(path, timeout=5.0) as client:
            old = client.inspect().pid
    except (AgentUnavailable, OSError):
        old = None
    if old is not None and old != target + 1:
        os.kill(old, signal.SIGKILL)
        wait_process_gone(old)
    if old != target + 1:
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(target - 1))
    with executor_client(deployment) as client:
        pid = client.inspect().pid
    return local_address_toward(DRIVER_ADDRESS), pid


def test_executor_agents_keep_sockets_and_logs_in_their_own_hosts_tmpdir(
    session: ClusterSession, cluster: NetCluster
) -> None:
    """The deployment comes from the driver; each executor's agent files go under its own
    host's `$TMPDIR`, none under the driver's."""
    import spark_connector

    spark_connector.overlay(session.spark)  # an agent on every executor
    for host in cluster.hosts:
        socket_path = live_agent_socket(host)
        assert Path(f"{socket_path}.log").exists()
    driver_dir = Path(session.deployment.driver_socket).parent
    assert driver_dir.is_relative_to(cluster.dir / "driver-tmp")
    assert not list(driver_dir.glob("exec-*")), sorted(p.name for p in driver_dir.iterdir())


def test_rows_written_on_every_host_are_read_once_by_a_batch_read_and_a_stream(
    session: ClusterSession, cluster: NetCluster
) -> None:
    from pyspark.sql import functions as F

    from spark_connector.deployment import local_address_toward

    spark = session.spark
    rows = 3_000
    driver_address = DRIVER_ADDRESS
    writer_host = F.udf(lambda: local_address_toward(driver_address), "string")
    (
        spark.range(0, rows, numPartitions=4 * WORKERS)
        .select(F.concat_ws(":", F.col("id").cast("string"), writer_host()).alias("value"))
        .write.format("episub")
        .option("topic", "across")
        .mode("append")
        .save()
    )
    batch = [
        r.value for r in spark.read.format("episub").option("topic", "across").load().collect()
    ]
    assert ids_of(batch) == list(range(rows))
    hosts = {v.decode().split(":")[1] for v in batch}
    assert hosts == {h.address for h in cluster.hosts}, "rows were not written on every host"

    query = (
        reader_frame(spark, "across")
        .writeStream.format("memory")
        .queryName("across_stream")
        .option("checkpointLocation", str(cluster.dir / "across-stream"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(QUERY_LIMIT), "the availableNow stream did not end"
        assert query.exception() is None, query.exception()
    finally:
        stop_all(query)
    streamed = [r.value for r in spark.sql("select value from across_stream").collect()]
    assert ids_of(streamed) == list(range(rows))


def cut_cases() -> list[Any]:
    """60 s, past TCP's user timeout (40 s): every connection to the host is reset and its
    nodes link again from nothing; 20 s: the connections stall and resume (in this
    emulation they are often reset too). Each once in the suite, CUT_RUNS times on demand."""
    on_demand = pytest.mark.skipif(
        os.environ.get("EPISUB_ONDEMAND") != "1", reason="on demand (EPISUB_ONDEMAND=1)"
    )
    return [
        pytest.param(seconds, run, id=f"{seconds}s-run{run}", marks=on_demand if run else ())
        for seconds in (60, 20)
        for run in range(CUT_RUNS)
    ]


@pytest.mark.parametrize(("cut_seconds", "run"), cut_cases())
def test_a_host_cut_off_catches_up_rows_once_and_the_drivers_configuration(
    session: ClusterSession, cluster: NetCluster, cut_seconds: int, run: int
) -> None:
    """A writer stream and a reader stream run while one host is cut off and the driver
    writes configuration. After the link returns: every row read once; within
    CONFIG_CATCH_UP s the cut-off host's replica holds the driver's values, and at no
    moment does it claim a version (what `wait_for` waits on) whose values it lacks.

    Every executor's node is in the topic before the streams start, as it is once both
    streams' tasks have run on every executor: the sink's commit waits (acks=1) for
    another node to hold its batch index, and a driver's node whose only other node in the
    topic is the host cut off has none to ask for ackTimeout (30 s). Which executors run
    the first tasks is Spark's choice, and on a loaded machine the cut may come before
    any; the streams' first rows are read before the cut, so that it cuts a running
    pipeline."""
    import spark_connector
    from spark_connector.connect import reach_nodes

    spark = session.spark
    topic = f"cut{cut_seconds}r{run}"
    victim = cluster.hosts[-1]
    cfg = spark_connector.cluster_config(spark)
    reach_nodes(spark, driver=False, config="default")  # every executor's replica running
    cfg.set("mode", f"{topic}-before")
    victim_socket = live_agent_socket(victim)
    with AgentClient(str(victim_socket), timeout=30.0) as client:
        client.config_read("default", cfg.version(), timeout=30.0)
    join_every_node(session, cluster, topic)

    feeder = Feeder(cluster.dir / f"{topic}-in")
    writer = reader = None
    try:
        writer = Supervised(
            lambda: writer_stream(spark, feeder.dir, topic, cluster.dir / f"{topic}-wcp"),
            f"the writer of {topic}",
        )
        reader = Supervised(
            lambda: (
                reader_frame(spark, topic)
                .writeStream.format("memory")
                .queryName(topic)
                .option("checkpointLocation", str(cluster.dir / f"{topic}-rcp"))
                .trigger(processingTime="1 second")
                .start()
            ),
            f"the reader of {topic}",
        )
        feeder.for_seconds(3)
        count = lambda: spark.sql(f"select count(*) n from {topic}").first().n  # noqa: E731

        def first_rows() -> bool:
            writer.check()
            reader.check()
            feeder.for_seconds(1)  # the writer's pace goes on while we wait
            return count() > 0

        wait_until(first_rows, QUERY_LIMIT, f"the reader of {topic}: its first rows")
        cluster.cut(victim)
        feeder.for_seconds(cut_seconds / 2)
        cfg.update({"mode": f"{topic}-during", "written_while_cut": cut_seconds})
        cfg.set("second", "write")  # two versions the cut-off host misses
        expected_version = cfg.version()
        expected = cfg.snapshot()
        feeder.for_seconds(cut_seconds / 2)
        cluster.restore(victim)
        restored = time.monotonic()

        problems, took = replica_problems(victim_socket, expected_version, expected, restored)
        if took is not None:
            print(f"{topic}: the cut-off host held the driver's values {took:.2f} s after "
                  "the link's return")  # fmt: skip
        # The fault the issue saw: a later write reaches the host, whose version then
        # claims values it still lacks.
        later_version = cfg.set("after", "restore")
        with AgentClient(str(victim_socket), timeout=60.0) as client:
            view = client.config_read("default", later_version, timeout=CONFIG_CATCH_UP)
        if view.values != cfg.snapshot():
            problems.append(f"at version {view.version} it holds {view.values}")

        feeder.for_seconds(3)
        writer.process_all_available()
        wait_rows(reader, count, feeder.written)
    finally:
        cluster.restore(victim)
        stop_all(writer, reader)
    values = [r.value for r in spark.sql(f"select value from {topic}").collect()]
    assert ids_of(values) == list(range(feeder.written))
    assert live_agent_socket(victim) == victim_socket, "the cut-off host's executor was replaced"
    assert not problems, (
        f"{victim.name}'s configuration replica: {problems}\n{log_tail(victim_socket)}"
    )


def join_every_node(session: ClusterSession, cluster: NetCluster, topic: str) -> None:
    """The driver's node in `topic` (as a reader's planner joins it: no history), then
    every executor's through it (as a sink task joins): each linked to the driver's."""
    deployment = session.deployment
    with AgentClient(deployment.driver_socket, timeout=30.0) as client:
        client.join(topic, history=False)
    for host in cluster.hosts:
        with AgentClient(str(live_agent_socket(host)), timeout=60.0) as client:
            client.join(topic, [deployment.driver_address], timeout=30.0)


def log_tail(socket_path: Path, size: int = 4000) -> str:
    """The end of the agent's log (beside its socket), for a failure's message."""
    log = Path(f"{socket_path}.log")
    text = log.read_bytes()[-size:].decode(errors="replace") if log.exists() else "no log"
    return f"--- {log.name}:\n{text}"


def replica_problems(
    socket_path: Path, version: int, values: dict[str, object], restored: float
) -> tuple[list[str], float | None]:
    """What is wrong with the replica behind `socket_path`, read from the link's return
    (`restored`) until it holds `values` at `version` or later (at most CONFIG_CATCH_UP s):
    a version at or past `version` reported without `values` (what
    would make `wait_for(version)` return True too early), or `values` not held within
    CONFIG_CATCH_UP s; and how long after `restored` it held them (None: not in time)."""
    stale: list[tuple[int, dict[str, object]]] = []
    deadline = restored + CONFIG_CATCH_UP
    held_at = None
    last_seen = "nothing"
    with AgentClient(str(socket_path), timeout=30.0) as client:
        while time.monotonic() < deadline:
            view = client.config_read("default")
            last_seen = f"version {view.version}, {view.values}"
            if view.version >= version:
                if view.values == values:
                    held_at = time.monotonic()
                    break
                stale.append((view.version, dict(view.values)))
            try:  # what wait_for(version) does: it must not answer with other values
                waited = client.config_read("default", version, timeout=0.2)
            except AgentWaitExpired:
                pass
            else:
                if waited.values != values:
                    stale.append((waited.version, dict(waited.values)))
    problems = [f"claimed version {v} holding {held}" for v, held in stale[:3]]
    if held_at is None or held_at - restored > CONFIG_CATCH_UP:
        problems.append(
            f"did not hold version {version}'s values within {CONFIG_CATCH_UP} s of the "
            f"link's return (last seen: {last_seen})"
        )
        return problems, None
    return problems, held_at - restored


def test_a_session_stopped_mid_stream_restarts_in_the_same_process(
    session: ClusterSession, cluster: NetCluster
) -> None:
    """`spark.stop()` while a writer and a reader stream run, a new session in this process,
    `register` with the same key, both restarted from their checkpoints: each row once.
    (Last in the module: it replaces the session.)"""
    feeder = Feeder(cluster.dir / "restart-in")
    out = cluster.dir / "restart-out"
    writer = reader = None

    def start_both() -> tuple[Supervised, Supervised]:
        spark = session.spark
        w = Supervised(
            lambda: writer_stream(spark, feeder.dir, "restart", cluster.dir / "restart-wcp"),
            "the writer",
        )
        r = Supervised(
            lambda: (
                reader_frame(spark, "restart")
                .writeStream.format("parquet")
                .option("path", str(out))
                .option("checkpointLocation", str(cluster.dir / "restart-rcp"))
                .trigger(processingTime="1 second")
                .start()
            ),
            "the restarted reader",
        )
        return w, r

    def written() -> Any:  # the sink's committed files (its _spark_metadata log)
        return session.spark.read.schema("value string").parquet(str(out))

    def parquet_count() -> int:
        return written().count() if (out / "_spark_metadata").exists() else 0

    try:
        writer, reader = start_both()
        feeder.for_seconds(5)

        def first_rows() -> bool:
            reader.check()
            return parquet_count() > 0

        wait_until(first_rows, QUERY_LIMIT, "the reader's first rows")
        feeder.for_seconds(2)
        session.stop()  # both queries running
        session.start()
        writer, reader = start_both()
        feeder.for_seconds(5)
        writer.process_all_available()
        wait_rows(reader, parquet_count, feeder.written)
    finally:
        if session.spark is not None:
            stop_all(writer, reader)
    values = [r.value for r in written().collect()]
    assert ids_of(values) == list(range(feeder.written))
