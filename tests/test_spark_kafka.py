"""Kafka's vocabulary on real Spark (local[2,4]): subscribe, subscribePattern,
maxOffsetsPerTrigger, minOffsetsPerTrigger with maxTriggerDelay, startingTimestamp,
startingOffsetsByTimestamp, -2/-1 in JSON offsets, includeHeaders, batch reads between
offsets or times, minPartitions and maxRecordsPerPartition, the bootstrap option, Kafka
options refused, lag in the query's progress; the sink's column and mode rules and its
acknowledgements; a driver's node that restarts mid-query; where to scrape each agent's
metrics. One SparkSession for the module; agents stopped by pid."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark", reason="the Spark connector needs the spark extra")

from pyspark.sql import SparkSession

import spark_connector
from episub.agent import AgentClient, AgentUnavailable
from spark_connector.deployment import driver_client
from tests.proc_helpers import Processes, node_ready, start_node, wait_process_gone

pytestmark = [pytest.mark.timeout(300), pytest.mark.spark]

KEY = bytes(range(32))
LIMIT = 120.0  # s: the longest any awaited condition may take on a loaded 2-core machine


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2,4]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def deployment(spark: SparkSession) -> Iterator[spark_connector.Deployment]:
    deployment = spark_connector.register(spark, key=KEY, metrics=True)
    yield deployment
    with contextlib.suppress(AgentUnavailable), AgentClient(deployment.driver_socket) as client:
        os.kill(client.inspect().pid, signal.SIGTERM)  # its owner (pytest) lives on


def driver(deployment: spark_connector.Deployment) -> AgentClient:
    """The driver's agent, started again as the planners do if a test ended it."""
    return driver_client(deployment)


def wait_for(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + LIMIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)  # each look runs a Spark job or a query step: no event to await


def available_now(spark: SparkSession, name: str, **options: str) -> list:  # type: ignore[type-arg]
    """Run a source query with Trigger.AvailableNow into memory table `name`; its rows."""
    reader = spark.readStream.format("episub")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = reader.load().writeStream.format("memory").queryName(name)
    query = query.trigger(availableNow=True).start()
    assert query.awaitTermination(LIMIT), "AvailableNow did not stop"
    assert query.exception() is None, query.exception()
    return spark.sql(f"select * from {name}").collect()


def test_subscribe_and_max_offsets_per_trigger_read_every_topic_in_bounded_batches(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    with driver(deployment) as client:
        for topic in ("k.a", "k.b"):
            client.join(topic)
            client.publish_batch(topic, [b"%s %d" % (topic.encode(), i) for i in range(60)])
    reader = (
        spark.readStream.format("episub")
        .option("subscribe", "k.a,k.b")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "25")
        .load()
    )
    query = reader.writeStream.format("memory").queryName("subscribed").trigger(availableNow=True)
    query = query.start()
    assert query.awaitTermination(LIMIT) and query.exception() is None
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes and max(sizes) <= 25 and sum(sizes) == 120
    rows = spark.sql("select topic, count(*) c from subscribed group by topic").collect()
    assert {r.topic: r.c for r in rows} == {"k.a": 60, "k.b": 60}


def test_subscribe_pattern_reads_the_matching_topics_the_overlay_knows_even_later_ones(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    with driver(deployment) as client:
        for topic in ("pat.one", "pat.two", "unrelated"):
            client.join(topic)
            client.publish_batch(topic, [topic.encode()] * 3)
    query = (
        spark.readStream.format("episub")
        .option("subscribePattern", r"pat\..*")
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("memory")
        .queryName("patterned")
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:

        def topics_read() -> dict[str, int]:
            query.processAllAvailable()
            rows = spark.sql("select topic, count(*) c from patterned group by topic").collect()
            return {r.topic: r.c for r in rows}

        wait_for(lambda: topics_read() == {"pat.one": 3, "pat.two": 3}, "both topics")
        with driver(deployment) as client:
            client.join("pat.three")  # created while the query runs
            client.publish_batch("pat.three", [b"late"] * 4)
        wait_for(lambda: topics_read().get("pat.three") == 4, "the topic made later")
        assert "unrelated" not in topics_read()
    finally:
        query.stop()


def test_min_offsets_per_trigger_waits_for_enough_rows_or_max_trigger_delay(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    topic = "trickle"
    with driver(deployment) as client:
        client.join(topic)
        client.publish_batch(topic, [b"few"] * 10)
    started = time.time()
    query = (
        spark.readStream.format("episub")
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("minOffsetsPerTrigger", "50")
        .option("maxTriggerDelay", "3s")
        .load()
        .writeStream.format("memory")
        .queryName("trickled")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: any(p["numInputRows"] for p in query.recentProgress), "a batch")
        first = next(p for p in query.recentProgress if p["numInputRows"])
        assert first["numInputRows"] == 10
        # Ten rows wait for maxTriggerDelay after the query's first batch (which only took
        # the publisher in), not for the next trigger.
        ran_at = time.mktime(time.strptime(first["timestamp"][:19], "%Y-%m-%dT%H:%M:%S"))
        assert ran_at - started >= 3 - 1  # whole seconds in Spark's stamp, hence the -1
        with driver(deployment) as client:
            client.publish_batch(topic, [b"many"] * 60)
        wait_for(
            lambda: spark.sql("select count(*) c from trickled").collect()[0].c == 70,
            "the 60 rows",
        )
    finally:
        query.stop()


def test_starting_timestamp_and_json_offsets_with_minus_two_and_minus_one(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    topic = "stamped"
    with driver(deployment) as client:
        client.join(topic)
        for i in range(5):
            client.publish(topic, b"%d" % i, stream=(b"clocked", i), timestamp_ms=1000 * (i + 1))
        client.publish_batch(topic, [b"own %d" % i for i in range(4)])
        own = client.inspect().node_id.decode("latin-1")
    rows = available_now(spark, "from_time", topic=topic, startingTimestamp="3000")
    assert sorted(r.seq for r in rows if r.publisher == "clocked") == [2, 3, 4]
    starting = json.dumps({topic: {"clocked": -1, own: -2}})
    rows = available_now(spark, "from_json", topic=topic, startingOffsets=starting)
    assert sorted((r.publisher, r.seq) for r in rows) == [(own, i) for i in range(4)]


def test_include_headers_false_drops_the_headers_column(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    topic = "headed"
    with driver(deployment) as client:
        client.join(topic)
        client.publish(topic, b"v", headers={"h": b"1"})
    with_headers = available_now(spark, "with_headers", topic=topic, startingOffsets="earliest")
    assert [list(r.headers) for r in with_headers] == [[("h", bytearray(b"1"))]]
    without = available_now(
        spark, "without_headers", topic=topic, startingOffsets="earliest", includeHeaders="false"
    )
    assert "headers" not in without[0].asDict() and without[0].value == bytearray(b"v")


def test_a_batch_read_returns_the_rows_between_two_offsets(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    topic = "ranged"
    with driver(deployment) as client:
        client.join(topic)
        published = client.publish_batch(topic, [b"%d" % i for i in range(10)])
    publisher = published[0].publisher.decode("latin-1")
    between = (
        spark.read.format("episub")
        .option("topic", topic)
        .option("startingOffsets", json.dumps({topic: {publisher: 3}}))
        .option("endingOffsets", json.dumps({topic: {publisher: 7}}))
        .load()
    )
    assert sorted(r.seq for r in between.collect()) == [3, 4, 5, 6]
    everything = spark.read.format("episub").option("topic", topic).load()
    assert everything.count() == 10  # earliest to latest by default
    with pytest.raises(Exception, match="for streaming queries"):
        spark.read.format("episub").option("topic", topic).option(
            "maxOffsetsPerTrigger", "5"
        ).load().collect()


def test_lag_shows_in_the_last_progress_as_latest_past_end_offsets(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    topic = "lagging"
    with driver(deployment) as client:
        client.join(topic)
        client.publish_batch(topic, [b"x"] * 100)
    query = (
        spark.readStream.format("episub")
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "10")
        .load()
        .writeStream.format("memory")
        .queryName("lagged")
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        wait_for(lambda: any(p["numInputRows"] for p in query.recentProgress), "a batch")
        progress = next(p for p in query.recentProgress if p["numInputRows"])
        source = progress["sources"][0]
        latest = json.loads(source["latestOffset"])
        assert sum(latest[topic].values()) == 100
        assert spark_connector.lag(progress) == 100 - sum(
            json.loads(source["endOffset"])[topic].values()
        )
        assert spark_connector.lag(progress) >= 80
    finally:
        query.stop()


def test_sink_columns_match_whatever_their_case_and_a_topic_column_needs_the_option(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    """Issue 15: the schema check lowercased names and the writer read exact ones, so `Key`
    and `Headers` were dropped and `Value` failed with "value is null"."""
    topic = "cased"
    frame = spark.createDataFrame(
        [(b"v1", b"k1", [("h", b"x")])],
        "Value binary, Key binary, Headers array<struct<key:string,value:binary>>",
    )
    frame.write.format("episub").option("topic", topic).mode("append").save()
    rows = available_now(spark, "cased_rows", topic=topic, startingOffsets="earliest")
    assert [
        (bytes(r.value), bytes(r.key), [(h[0], bytes(h[1])) for h in r.headers]) for r in rows
    ] == [(b"v1", b"k1", [("h", b"x")])]
    with_topic = spark.createDataFrame([(b"v", "cased")], "value binary, topic string")
    with pytest.raises(Exception, match='needs option "topic"'):
        with_topic.write.format("episub").mode("append").save()
    with pytest.raises(Exception, match="only appends"):
        with_topic.write.format("episub").option("topic", topic).mode("overwrite").save()


@pytest.mark.parametrize("acks", ["local", "1", "all"])
def test_every_ack_level_writes_each_row_once(
    spark: SparkSession, deployment: spark_connector.Deployment, acks: str
) -> None:
    topic = f"acked-{acks}"
    frame = spark.createDataFrame([(b"%d" % i,) for i in range(500)], "value binary").repartition(2)
    frame.write.format("episub").option("topic", topic).option("acks", acks).mode("append").save()
    rows = available_now(spark, f"acked_{acks}", topic=topic, startingOffsets="earliest")
    assert sorted(bytes(r.value) for r in rows) == sorted(b"%d" % i for i in range(500))


def test_a_query_goes_on_when_the_drivers_node_restarts_without_its_history(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    """Issue 15: a driver's node that restarted (on its address, with no history) made the
    next latestOffset raise DataLossError while the executors' nodes still held the rows.
    Here the rows are published once the executor's node follows the topic, and the driver's
    node (their publisher, too) is killed before the query has read them."""
    topic = "forgetful"
    with driver(deployment) as client:
        client.join(topic)
        client.publish(topic, b"first")
    query = (
        spark.readStream.format("episub")
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "50")
        .load()
        .writeStream.format("memory")
        .queryName("forgetful_rows")
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: any(p["numInputRows"] for p in query.recentProgress), "a batch")
        with driver(deployment) as client:
            published = client.publish_batch(topic, [b"later %d" % i for i in range(300)])
            last = published[-1].seq

            def executor_holds_all() -> bool:
                nodes = client.holdings(topic, neighbors=True)
                return any(
                    s.last_seq == last and s.count == last + 1 for n in nodes[1:] for s in n.spans
                )

            wait_for(executor_holds_all, "the executor's node to hold every row")
            agent = client.inspect().pid
        os.kill(agent, signal.SIGKILL)  # its planners start it again on the same address
        wait_process_gone(agent)

        def all_read() -> bool:
            assert query.exception() is None, query.exception()
            return spark.sql("select count(*) c from forgetful_rows").collect()[0].c >= 301

        wait_for(all_read, "every row after the driver's node restarted")
    finally:
        query.stop()
    values = [bytes(r.value) for r in spark.sql("select value from forgetful_rows").collect()]
    assert sorted(values) == sorted([b"first", *(b"later %d" % i for i in range(300))])
    with driver(deployment) as client:
        assert client.inspect().address == deployment.driver_address  # the same address


def test_starting_offsets_by_timestamp_per_publisher_and_its_latest_strategy(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    topic = "stamped.each"
    with driver(deployment) as client:
        client.join(topic)
        for name in (b"early", b"late"):
            for i in range(5):
                client.publish(topic, b"%d" % i, stream=(name, i), timestamp_ms=1000 * (i + 1))
    by_time = json.dumps({topic: {"early": 2000, "late": 4000}})
    rows = available_now(spark, "by_time", topic=topic, startingOffsetsByTimestamp=by_time)
    assert sorted((r.publisher, r.seq) for r in rows) == [
        *(("early", i) for i in range(1, 5)),
        *(("late", i) for i in range(3, 5)),
    ]
    too_late = json.dumps({topic: {"early": 9000}})
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy"):
        available_now(spark, "too_late", topic=topic, startingOffsetsByTimestamp=too_late)
    rows = available_now(
        spark,
        "too_late_latest",
        topic=topic,
        startingOffsetsByTimestamp=too_late,
        startingOffsetsByTimestampStrategy="latest",
    )  # "early" from its latest: nothing yet; "late", not named, from its earliest
    assert sorted((r.publisher, r.seq) for r in rows) == [("late", i) for i in range(5)]


def test_a_batch_read_ends_at_a_time_and_splits_into_the_partitions_asked_for(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    topic = "timed.batch"
    with driver(deployment) as client:
        client.join(topic)
        for i in range(10):
            client.publish(topic, b"%d" % i, stream=(b"clock", i), timestamp_ms=1000 * (i + 1))

    def read(option: str, value: str):  # type: ignore[no-untyped-def]
        # A fresh reader each time: DataFrameReader.option changes the reader it is called on.
        return spark.read.format("episub").option("topic", topic).option(option, value).load()

    assert sorted(r.seq for r in read("endingTimestamp", "4000").collect()) == [0, 1, 2]
    by_publisher = read("endingOffsetsByTimestamp", json.dumps({topic: {"clock": 6000}}))
    assert sorted(r.seq for r in by_publisher.collect()) == [0, 1, 2, 3, 4]
    assert read("minPartitions", "4").rdd.getNumPartitions() == 4
    split = read("maxRecordsPerPartition", "3")
    assert split.rdd.getNumPartitions() == 4 and split.count() == 10


def test_the_bootstrap_option_reads_what_an_outside_node_publishes(
    spark: SparkSession, deployment: spark_connector.Deployment, processes: Processes
) -> None:
    """The option reaches the driver's node as well as the executors': the driver's node
    joins the topic through the outside node and finds its rows (issue 15: 0 rows read)."""
    topic = "outside.only"
    outside = start_node(processes, "outside", topics=[topic])
    _, address = node_ready(outside)
    with AgentClient(str(processes.dir / "outside.sock")) as client:
        client.publish_batch(topic, [b"o %d" % i for i in range(20)])
    rows = (
        spark.read.format("episub")
        .option("topic", topic)
        .option("bootstrap", address)
        .load()
        .collect()
    )
    assert sorted(bytes(r.value) for r in rows) == sorted(b"o %d" % i for i in range(20))
    assert {r.publisher for r in rows} == {rows[0].publisher} and sorted(
        r.seq for r in rows
    ) == list(range(20))
    # A sink through the same option, into a topic the outside node does not follow: the
    # driver's node is that topic's first node (its join through the outside node brings
    # no neighbour, and is no error).
    frame = spark.createDataFrame([(b"w %d" % i,) for i in range(5)], "value binary")
    frame.write.format("episub").option("topic", "outside.not").option("bootstrap", address).mode(
        "append"
    ).save()
    written = spark.read.format("episub").option("topic", "outside.not").load().collect()
    assert sorted(bytes(r.value) for r in written) == [b"w %d" % i for i in range(5)]


@pytest.mark.parametrize(
    ("option", "named"),
    [
        ("kafka.bootstrap.servers", '"bootstrap"'),
        ("assign", '"subscribe"'),
        ("kafka.group.id", "checkpoint"),
        ("fetchOffset.numRetries", '"fetchTimeout"'),
    ],
)
def test_a_kafka_option_with_no_meaning_here_fails_the_read_naming_episubs(
    spark: SparkSession, deployment: spark_connector.Deployment, option: str, named: str
) -> None:
    reader = spark.readStream.format("episub").option("topic", "t").option(option, "x")
    with pytest.raises(Exception, match=f"is Kafka's.*{named}|Kafka client setting"):
        reader.load()  # options are checked where the read is defined, before start()


def test_overlay_says_where_to_scrape_each_agents_metrics(
    spark: SparkSession, deployment: spark_connector.Deployment
) -> None:
    views = spark_connector.overlay(spark)
    assert [v.role for v in views][:1] == ["driver"] and "executor" in {v.role for v in views}
    for view in views:
        host = view.address.rsplit(":", 1)[0]
        assert view.metrics_url.startswith(f"http://{host}:"), view
        with urllib.request.urlopen(view.metrics_url, timeout=10) as answer:
            text = answer.read().decode()
        assert "episub_" in text, text[:300]


def test_a_stopped_source_lets_go_of_its_planner() -> None:
    """Issue 15: the source had no stop(); its planner's memory (the publishers it saw, the
    nodes that answered) outlived the query in Spark's planner process."""
    from spark_connector.options import parse_source
    from spark_connector.source import EpisubStreamReader

    reader = EpisubStreamReader(parse_source({"topic": "t"}), deployment=None)  # type: ignore[arg-type]
    planner = reader.planner
    assert reader.planner is planner  # one per query, made on first use
    reader._latest = {"t": {"p": 3}}
    reader.stop()
    assert reader._planner is None and reader.reportLatestOffset() is None
