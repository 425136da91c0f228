"""The `episub` Python data source, and `register(spark)` which makes it usable.

`register` draws the deployment key unless one is given, starts the driver's node, and
registers subclasses of `EpisubDataSource` (and of connect.py's `ControlDataSource`) that
carry the `Deployment`: Spark pickles data source classes by value when they are made at
run time, so every reader and writer on every executor gets the key and the driver's
address without either appearing in an option (options show in query plans and the UI).

Classic Spark: the driver's node is an agent process owned by the driver process, started
here. Spark Connect: this process is only a client; the driver's node is started beside
the server by a planner process there (connect.py), and this process runs no node.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from episub.agent import AgentClient, AgentError, AgentUnavailable
from episub.net.peer_id import parse_address
from episub.proto.store import RetentionConfig
from spark_connector.config import (
    DEFAULT_NAME,
    registered_deployment,
    remember_driver_deployment,
)
from spark_connector.connect import (
    SESSION_CONF,
    ControlDataSource,
    deployment_id,
    is_connect,
    place_remotely,
)
from spark_connector.deployment import (
    EXECUTOR_IDLE_TIMEOUT,
    Deployment,
    driver_client,
    join_through,
    place_driver,
    start_driver_agent,
)
from spark_connector.options import (
    OptionError,
    check_reader_options,
    parse_batch_source,
    parse_sink,
    parse_source,
)

__all__ = ["SCHEMA", "EpisubDataSource", "register"]

# Spark conf keys in our namespace, read by register() when its argument is not given.
PORT_CONF = "spark.episub.port"
EXECUTOR_PORTS_CONF = "spark.episub.executorPorts"
AGENT_PROBE_TIMEOUT = 5.0  # guess: a live agent answers inspect in milliseconds

# Kafka's source columns, with publisher/seq in place of partition/offset; `headers` goes
# with includeHeaders=false.
SCHEMA_NO_HEADERS = (
    "topic string, publisher string, seq long, timestamp timestamp, key binary, value binary"
)
SCHEMA = f"{SCHEMA_NO_HEADERS}, headers array<struct<key: string, value: binary>>"


class EpisubDataSource(DataSource):
    """Use `register(spark)`: this class alone does not know the deployment."""

    deployment: ClassVar[Deployment | None] = None

    @classmethod
    def name(cls) -> str:
        return "episub"

    def schema(self) -> str:
        # Spark asks for the schema when a read is defined (`load()`), in the caller's
        # thread: the one place a streaming query's option mistakes can fail there, rather
        # than after `start()` inside the query's own error.
        check_reader_options(self.options)
        include = self.options.get("includeHeaders", "true").strip().lower() != "false"
        return SCHEMA if include else SCHEMA_NO_HEADERS

    def _deployment(self, bootstrap: tuple[str, ...]) -> Deployment:
        """The deployment, its driver's node placed (this runs in a driver-side planner),
        with a query's `bootstrap` addresses among its outside contacts."""
        deployment = type(self).deployment
        if deployment is None:
            raise OptionError(
                "the episub data source is not registered with a deployment: call "
                "spark_connector.register(spark) first"
            )
        deployment = place_driver(deployment)
        if bootstrap:
            contacts = tuple(dict.fromkeys([*deployment.contacts, *bootstrap]))
            return dataclasses.replace(deployment, contacts=contacts)
        return deployment

    def streamReader(self, schema: StructType) -> Any:
        from spark_connector.source import EpisubStreamReader

        options = parse_source(self.options)
        return EpisubStreamReader(options, self._deployment(options.bootstrap))

    def reader(self, schema: StructType) -> Any:
        from spark_connector.source import EpisubBatchReader

        options = parse_batch_source(self.options)
        return EpisubBatchReader(options, self._deployment(options.bootstrap))

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        # `overwrite` is outputMode("complete"): every batch writes the whole result, which
        # a topic takes as it takes any rows (as Kafka's sink does).
        from spark_connector.sink import EpisubStreamWriter, check_sink_schema

        options = parse_sink(self.options)
        columns = check_sink_schema(schema, options)
        deployment = self._deployment(options.bootstrap)
        _join_on_driver(deployment, options.topics)
        return EpisubStreamWriter(options, deployment, columns)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from spark_connector.sink import EpisubBatchWriter, check_sink_schema

        if overwrite:
            raise OptionError(
                'the episub sink only appends: a topic cannot be emptied first; use mode("append")'
            )
        options = parse_sink(self.options)
        columns = check_sink_schema(schema, options)
        deployment = self._deployment(options.bootstrap)
        _join_on_driver(deployment, options.topics)
        return EpisubBatchWriter(options, deployment, columns)


def _join_on_driver(deployment: Deployment, topics: tuple[str, ...]) -> None:
    """Executors join through the driver's node, which must be in the topic first (through
    the outside contacts, if any, so that it is in their overlay)."""
    with driver_client(deployment) as client:
        for topic in topics:
            join_through(client, topic, deployment.contacts)


def register(
    spark: Any,
    *,
    key: bytes | None = None,
    host: str | None = None,
    retention: RetentionConfig | None = None,
    signed: bool = False,
    bootstrap: Sequence[str] = (),
    metrics: bool = False,
    port: int | None = None,
    executor_ports: str | tuple[int, int] | None = None,
) -> Deployment:
    """Start the driver's node and register the `episub` format with `spark`.

    Called again in the same driver process while its node runs (a second call, a new
    session after `spark.stop()`), it reuses that node and its key: with no `key` (or the
    same one) and no setting that differs from the running node's; a different `key`,
    `port`, `host`, `signed`, `retention`, `metrics` or `executor_ports` is refused with a
    ValueError naming them (the node keeps its settings while this process lives).

    spark: a classic SparkSession, or a Spark Connect one (`builder.remote("sc://...")`),
        whose driver's node is started beside the Connect server, never in this process.
    key: the deployment's 32-byte key (default: a fresh random one, so only this
        application's nodes can join; give one to let outside processes such as
        `episub publish` take part).
    host: the address nodes listen on and advertise (default: `spark.driver.host` for a
        local master, else this host's address).
    retention: what every node of the application (the driver's, each executor's) keeps
        for readers that come back to a range, e.g. a query restarted after a long stop
        (default: RetentionConfig(), ten minutes). Applies to agents this call starts.
    signed: signed publishing on every node of the application (docs/threat-model.md):
        each node signs what it publishes on its own stream and drops what its publisher
        did not sign, so no executor can publish as another. The sink's rows and live
        configuration writes travel on named streams, which signing does not cover.
        Outside nodes must use `--signed` too.
    port: the TCP port the driver's node listens on (default: Spark conf `spark.episub.port`,
        else any free port).
    executor_ports: "LOW-HIGH", the ports executors' nodes listen on, the first free one on
        each host (default: Spark conf `spark.episub.executorPorts`, else any free port);
        give a port for every executor a host may run.
    Returns the Deployment: `.bootstrap` is the driver node's address, for outside nodes.
    """
    if key is not None and (not isinstance(key, bytes) or len(key) != 32):
        raise ValueError(f"key must be 32 bytes, not {key!r:.20}")
    driver_port = _driver_port(spark, port)
    ports = _executor_ports(spark, executor_ports)
    if retention is not None and not isinstance(retention, RetentionConfig):
        raise TypeError(f"retention must be an episub RetentionConfig, not {retention!r:.60}")
    agent_config = (
        json.dumps({"retention": dataclasses.asdict(retention)}) if retention is not None else ""
    )
    if not isinstance(signed, bool):
        raise TypeError(f"signed must be True or False, not {signed!r:.60}")
    if not isinstance(metrics, bool):
        raise TypeError(f"metrics must be True or False, not {metrics!r:.60}")
    contacts = parse_sink({"bootstrap": ",".join(_addresses(bootstrap))}).bootstrap
    if metrics:
        from episub.extras import require

        require("metrics", "prometheus_client")
    if is_connect(spark):
        deployment = _register_connect(
            spark, key or secrets.token_bytes(32), host or _default_host(spark), agent_config,
            signed, contacts, metrics, driver_port, ports,
        )  # fmt: skip
    else:
        settings = _Settings(
            key, host or _default_host(spark), agent_config, signed, metrics, driver_port, ports
        )
        given = {
            label
            for label, value in (
                ("key", key), ("host", host), ("retention", retention),
                ("port", driver_port or None), ("executor_ports", ports),
                ("signed", signed or None), ("metrics", metrics or None),
            )
            if value is not None
        }  # fmt: skip
        settings = _this_process_settings(settings, given)
        deployment = start_driver_agent(
            settings.key or secrets.token_bytes(32), settings.host, settings.agent_config,
            settings.signed, contacts, settings.metrics, settings.driver_port,
            settings.executor_ports,
        )  # fmt: skip
        # The default live configuration's replica starts with the driver's node, so
        # executors reading it always find it (a topic is joined through a node in it).
        with driver_client(deployment) as client:
            client.config_read(DEFAULT_NAME)
        _bind(spark, deployment)
    remember_driver_deployment(deployment, spark)
    return deployment


@dataclass(frozen=True, slots=True)
class _Settings:
    """What the driver's node of this process is started with, and keeps while it runs."""

    key: bytes | None  # None: not given
    host: str
    agent_config: str  # retention
    signed: bool
    metrics: bool
    driver_port: int
    executor_ports: tuple[int, int] | None


def _this_process_settings(wanted: _Settings, given: set[str]) -> _Settings:
    """The settings of this process's driver node. While the node of an earlier register()
    runs: its own (it keeps them), after a check that none given differs (ValueError naming
    them). Otherwise `wanted`, with the earlier key when none is given: executors' nodes
    of that deployment may still run with it."""
    previous = registered_deployment()
    if previous is None or previous.driver_pid != os.getpid() or not previous.driver_socket:
        return wanted
    if not _answers(previous.driver_socket):
        return wanted if wanted.key is not None else replace(wanted, key=previous.key)
    running_port = parse_address(previous.driver_address).port
    differs = {
        "key": wanted.key != previous.key,
        "host": wanted.host != previous.host,
        "retention": wanted.agent_config != previous.agent_config,
        "port": wanted.driver_port != running_port,
        "executor_ports": wanted.executor_ports != previous.executor_ports,
        "signed": wanted.signed != previous.signed,
        "metrics": wanted.metrics != previous.metrics,
    }
    conflicts = [label for label, differ in differs.items() if differ and label in given]
    if conflicts:
        raise ValueError(
            "spark_connector.register(): the driver's episub node of this process (at "
            f"{previous.driver_address}) runs already with another {', '.join(conflicts)}, "
            "which it keeps while this process lives; call register(spark) without them to "
            "reuse it (same key)"
        )
    return _Settings(
        previous.key, previous.host, previous.agent_config, previous.signed, previous.metrics,
        previous.driver_port, previous.executor_ports,
    )  # fmt: skip


def _answers(socket_path: str) -> bool:
    try:
        with AgentClient(socket_path, timeout=AGENT_PROBE_TIMEOUT) as client:
            client.inspect()
    except (AgentUnavailable, AgentError, OSError):
        return False
    return True


def _driver_port(spark: Any, port: int | None) -> int:
    if port is None:
        text = _conf(spark, PORT_CONF)
        if text is None:
            return 0
        try:
            port = int(text)
        except ValueError:
            raise ValueError(f"{PORT_CONF} must be a TCP port, not {text!r}") from None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be a TCP port (0..65535), not {port!r:.40}")
    return port


def _executor_ports(spark: Any, ports: str | tuple[int, int] | None) -> tuple[int, int] | None:
    where = "executor_ports"
    if ports is None:
        ports = _conf(spark, EXECUTOR_PORTS_CONF)
        where = EXECUTOR_PORTS_CONF
        if ports is None:
            return None
    if isinstance(ports, str):
        low_text, _, high_text = ports.strip().partition("-")
        try:
            low, high = int(low_text), int(high_text or low_text)
        except ValueError:
            raise ValueError(f"{where} must be LOW-HIGH (e.g. 7400-7420), not {ports!r}") from None
    elif isinstance(ports, tuple) and len(ports) == 2:
        low, high = ports
    else:
        raise ValueError(f"{where} must be 'LOW-HIGH' or (low, high), not {ports!r:.40}")
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high <= 65535):
        raise ValueError(f"{where} must be LOW-HIGH with 1 <= LOW <= HIGH <= 65535, not {ports!r}")
    return (low, high)


def _conf(spark: Any, name: str) -> str | None:
    value = spark.conf.get(name, None)
    return None if value in (None, "") else str(value)


def _addresses(bootstrap: Sequence[str]) -> list[str]:
    if isinstance(bootstrap, str) or not all(isinstance(a, str) for a in bootstrap):
        raise TypeError(f"bootstrap must be a list of 'host:port' strings, not {bootstrap!r:.80}")
    return list(bootstrap)


def _register_connect(
    spark: Any,
    key: bytes,
    host: str,
    agent_config: str,
    signed: bool,
    contacts: tuple[str, ...],
    metrics: bool,
    driver_port: int,
    executor_ports: tuple[int, int] | None,
) -> Deployment:
    """The classes go first with the deployment as this client knows it; a control job then
    places the driver's node beside the server (its replica of the default configuration
    too), and the classes are registered again with the placed deployment, so every later
    planner knows the node's address and can start it again there if it retired."""
    draft = Deployment(
        key_hex=key.hex(),
        host=host,
        bootstrap=(),
        driver_socket="",
        driver_pid=0,
        agent_config=agent_config,
        signed=signed,
        id=deployment_id(),
        driver_idle_timeout=EXECUTOR_IDLE_TIMEOUT,
        contacts=contacts,
        metrics=metrics,
        driver_port=driver_port,
        executor_ports=executor_ports,
    )
    _bind(spark, draft)
    deployment = place_remotely(spark, draft)
    _bind(spark, deployment)
    # Tasks of later jobs find the deployment here (connect.py): its public form only.
    spark.conf.set(SESSION_CONF, deployment.public().to_json())
    return deployment


def _bind(spark: Any, deployment: Deployment) -> None:
    """Register the data sources with `deployment` in them."""
    for base in (EpisubDataSource, ControlDataSource):
        bound = type(base.__name__, (base,), {"deployment": deployment})
        bound.__module__ = "__main__"  # a class made at run time is pickled by value
        spark.dataSource.register(bound)


def _default_host(spark: Any) -> str:
    master = spark.conf.get("spark.master", "") or ""
    if master.startswith(("local", "spark://127.", "spark://localhost")):
        return "127.0.0.1"
    return spark.conf.get("spark.driver.host", "127.0.0.1") or "127.0.0.1"
