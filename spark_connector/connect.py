"""What a client does through Spark when it cannot reach the driver's node itself.

A Spark Connect client (`SparkSession.builder.remote("sc://...")`) is not the driver: the
driver runs inside the Connect server, usually on another machine, and the client has no
`sparkContext`. Whatever needs the driver's node (placing it, reading and writing live
configuration, `overlay`) runs as a small Spark job of the `episub_control` data source,
whose driver-side methods run in a planner process of the server (a child of its JVM),
beside the driver's node, and whose tasks run on executors. Classic sessions use it for
`overlay` too, so both modes go one way.

How the deployment travels under Connect (checked on PySpark 4.3's own server, see
tests/test_spark_connect.py, which looks for the key everywhere it could show):
- To planners, inside the data source classes `register()` registers: the client pickles
  them by value, and Spark keeps them as bytes that `explain`, the logs and the event log
  (what the UI shows) never print; the Connect UI abbreviates bytes fields to 8 bytes.
  Planners place the driver's node and hand the deployment on to executors inside the
  readers, writers and partitions they make, as in classic Spark.
- To a task that has nothing of ours in it (a UDF calling `config.get`), only the session's
  configuration reaches: Spark copies it into every job's properties. Spark writes job
  properties to the event log unredacted (it redacts only keys of the SparkConf, fixed
  when the server starts), so the session carries the deployment's public form
  (`SESSION_CONF`, no key), and such a task uses the agent a keyed task started on its
  executor (deployment.py, `executor_client`). Session files (`addArtifacts`) are no way
  around it: PySpark 4.3 gives them to batch jobs but not to streaming ones.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)

from episub.agent import AgentClient, AgentWaitExpired, ConfigView
from episub.config.codec import Update, decode, encode_snapshot, encode_update, entry_for, value_of
from episub.config.state import Entry
from episub.proto.reserved import CLUSTER_TOPIC
from spark_connector.deployment import (
    Deployment,
    driver_client,
    executor_client,
    place_driver,
)
from spark_connector.options import OptionError

__all__ = [
    "CONTROL_FORMAT",
    "SESSION_CONF",
    "ControlDataSource",
    "deployment_id",
    "executor_count",
    "is_connect",
    "place_remotely",
    "reach_nodes",
    "read_config",
    "write_config",
]

CONTROL_FORMAT = "episub_control"
# The session configuration carrying the deployment's public form to every task (see the
# module doc). Spark copies only keys starting with "spark" into job properties.
SESSION_CONF = "spark.episub.deployment"
ATTEMPTS = 10  # probe jobs at most; guess: two or three reach every executor of a small cluster
_OPS = ("driver", "config", "nodes")


def is_connect(spark: Any) -> bool:
    """Whether `spark` is a Spark Connect session (without importing Connect's client)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def deployment_id() -> str:
    """A new deployment's id: names its agents on a server that many sessions share."""
    return secrets.token_hex(6)


# -- server side: the data source ---------------------------------------------------------


@dataclass(frozen=True)
class Answer(InputPartition):
    """A row computed by the planner beside the driver's node; its task only yields it."""

    role: str
    body: str


@dataclass(frozen=True)
class Probe(InputPartition):
    """A task that starts (or finds) its executor's node and reports it; with `config`,
    starts that configuration's replica there too (caught up before any task reads it)."""

    deployment: Deployment
    config: str = ""


@dataclass
class ConfigCommit(WriterCommitMessage):
    bodies: list[str]


class ControlDataSource(DataSource):
    """`spark.read.format("episub_control").option("op", ...)`: internal, bound to a
    deployment by `register()`. Rows are (role, body): body is JSON."""

    deployment: ClassVar[Deployment | None] = None

    @classmethod
    def name(cls) -> str:
        return CONTROL_FORMAT

    def schema(self) -> str:
        return "role string, body string"

    def _placed(self) -> Deployment:
        deployment = type(self).deployment
        if deployment is None:
            raise OptionError("call spark_connector.register(spark) first")
        return place_driver(deployment)

    def reader(self, schema: Any) -> ControlReader:
        options = {k.lower(): v for k, v in self.options.items()}
        op = options.get("op", "")
        if op not in _OPS:
            raise OptionError(f"op must be one of {', '.join(_OPS)}, not {op!r}")
        return ControlReader(op, options, self._placed())

    def writer(self, schema: Any, overwrite: bool) -> ConfigWriter:
        if [f.name for f in schema.fields] != ["body"]:
            raise OptionError("episub_control takes config writes: one 'body' column")
        return ConfigWriter(self._placed())


class ControlReader(DataSourceReader):
    def __init__(self, op: str, options: dict[str, str], deployment: Deployment) -> None:
        self.op = op
        self.options = options
        self.deployment = deployment

    def partitions(self) -> Sequence[InputPartition]:  # on the driver, beside its node
        if self.op == "driver":
            with driver_client(self.deployment) as client:
                client.config_read("default")  # its replica starts with the node (register)
            return [Answer("driver", self.deployment.public().to_json())]
        if self.op == "config":
            return [Answer("config", self._config())]
        out: list[InputPartition] = []
        if self.options.get("driver") == "true":
            with driver_client(self.deployment) as client:
                out.append(Answer("driver", json.dumps(node_view("driver", client))))
        slices = int(self.options.get("slices", "0"))
        out += [Probe(self.deployment, self.options.get("config", "")) for _ in range(slices)]
        return out

    def _config(self) -> str:
        name = self.options.get("name", "default")
        min_version = int(self.options.get("minversion", "0"))
        timeout = float(self.options.get("timeout", "0"))
        with driver_client(self.deployment) as client:
            try:
                view = client.config_read(name, min_version, timeout)
            except AgentWaitExpired:
                return json.dumps({"timeout": True})
        return view_to_json(view)

    def read(self, partition: InputPartition) -> Iterator[tuple[str, str]]:
        if isinstance(partition, Answer):
            yield (partition.role, partition.body)
        else:
            assert isinstance(partition, Probe)
            with executor_client(partition.deployment) as client:
                if partition.config:
                    client.config_read(partition.config)
                yield ("executor", json.dumps(node_view("executor", client)))


class ConfigWriter(DataSourceWriter):
    """Writes configuration through the driver's node, from `commit` (once per job, on the
    driver): one writer for every write keeps the versions in the order they were made."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment

    def write(self, iterator: Iterator[Any]) -> ConfigCommit:
        return ConfigCommit([row[0] for row in iterator])

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        bodies = [b for m in messages if isinstance(m, ConfigCommit) for b in m.bodies]
        with driver_client(self.deployment) as client:
            for body in bodies:
                write = json.loads(body)
                name, update = write["name"], decode(write["update"].encode())
                assert isinstance(update, Update)
                values = {k: value_of(e) for k, e in update.changes.items() if e.kind != "deleted"}
                deleted = [k for k, e in update.changes.items() if e.kind == "deleted"]
                client.config_write(name, values, deleted)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # nothing was written: writes happen in commit


def node_view(role: str, client: AgentClient) -> dict[str, Any]:
    status = client.inspect()
    neighbors = [
        {"address": n.address, "kind": n.kind, "role": n.role, "rtt_ms": n.rtt_ms}
        for n in status.topics.get(CLUSTER_TOPIC, [])
    ]
    return {
        "role": role,
        "node_id": status.node_id.hex(),
        "pid": status.pid,
        "address": status.address,
        "neighbors": neighbors,
        "stats": status.stats,
        "metrics_url": status.metrics_url,
    }


def view_to_json(view: ConfigView) -> str:
    entries = {
        k: entry_for(v, *view.stamps[k]) if k in view.stamps else entry_for(v, 1, b"-")
        for k, v in view.values.items()
    }
    snapshot = encode_snapshot((), entries).decode()
    return json.dumps({"name": view.name, "version": view.version, "snapshot": snapshot})


def view_from_json(text: str) -> ConfigView:
    body = json.loads(text)
    snapshot = decode(body["snapshot"].encode())
    entries: Mapping[str, Entry] = getattr(snapshot, "entries", {})
    return ConfigView(
        name=body["name"],
        version=body["version"],
        values={k: value_of(e) for k, e in entries.items()},
        stamps={k: e.stamp for k, e in entries.items()},
    )


# -- client side ----------------------------------------------------------------------------


def control_rows(spark: Any, op: str, **options: object) -> list[tuple[str, str]]:
    reader = spark.read.format(CONTROL_FORMAT).option("op", op)
    for name, value in options.items():
        reader = reader.option(name, str(value).lower() if isinstance(value, bool) else str(value))
    return [(row.role, row.body) for row in reader.load().collect()]


def place_remotely(spark: Any, draft: Deployment) -> Deployment:
    """The deployment with its driver's node placed by the Connect server (`register`)."""
    try:
        [(_, body)] = control_rows(spark, "driver")
    except Exception as exc:
        raise RuntimeError(
            "the Spark Connect server could not start the driver's episub node: "
            f"{spark_error_line(exc)}. The server's Python (PYSPARK_PYTHON where it was "
            "started) needs episub installed: docs/spark.md, Spark Connect"
        ) from exc
    return dataclasses.replace(Deployment.from_json(body), key_hex=draft.key_hex)


def read_config(
    spark: Any, name: str, min_version: int = 0, timeout: float = 0.0
) -> ConfigView | None:
    """Configuration `name` as the driver's replica holds it; None if `min_version` was not
    reached within `timeout` s."""
    [(_, body)] = control_rows(spark, "config", name=name, minVersion=min_version, timeout=timeout)
    if json.loads(body).get("timeout"):
        return None
    return view_from_json(body)


def write_config(
    spark: Any, name: str, values: Mapping[str, object], deleted: Sequence[str]
) -> None:
    """One write through the driver's node (values checked here first: bytes or JSON)."""
    changes = {k: entry_for(v, 1, b"-") for k, v in values.items()}
    changes.update({k: Entry(1, b"-", "deleted", b"") for k in deleted})
    body = json.dumps({"name": name, "update": encode_update(1, b"-", changes).decode()})
    frame = spark.createDataFrame([(body,)], "body string")
    frame.write.format(CONTROL_FORMAT).mode("append").save()


def executor_count(spark: Any) -> int | None:
    """How many executors the application has, when Spark says; None when it does not."""
    master = spark.conf.get("spark.master", "") or ""
    if master.startswith("local-cluster["):
        return int(master[len("local-cluster[") :].split(",")[0])
    if master.startswith("local"):
        return 1  # the driver's JVM is the one executor
    if not is_connect(spark):
        return max(1, spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1)
    instances = spark.conf.get("spark.executor.instances", None)
    return int(instances) if instances else None


def reach_nodes(spark: Any, *, driver: bool, config: str = "") -> list[dict[str, Any]]:
    """Every executor's node (started where missing, with configuration `config`'s replica
    if given), by probe jobs repeated until each executor Spark reports has answered, or,
    when Spark does not say how many there are, until a job finds no new one; the driver's
    first when asked. Spark places tasks where it likes, so an executor busy with other
    work may be missed. Nodes are told apart by node id: pids repeat across hosts and
    containers."""
    expected = executor_count(spark)
    slices = 4 * (expected or 2)
    found: dict[str, dict[str, Any]] = {}  # node id (hex) -> its view
    driver_view: list[dict[str, Any]] = []
    for attempt in range(ATTEMPTS):
        before = len(found)
        for role, body in control_rows(
            spark, "nodes", driver=driver and attempt == 0, slices=slices, config=config
        ):
            view = json.loads(body)
            if role == "driver":
                driver_view.append(view)
            else:
                found[view["node_id"]] = view
        if expected is not None:
            if len(found) >= expected:
                break
        elif attempt > 0 and len(found) == before:
            break
    return driver_view + sorted(found.values(), key=lambda v: v["node_id"])


def spark_error_line(exc: BaseException) -> str:
    """The Python error at the bottom of a Spark error's text (the one a data source
    raised), else its first line."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) and " " not in head and ":" in line:
            return line
    return lines[0] if lines else type(exc).__name__
