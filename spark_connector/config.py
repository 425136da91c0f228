"""Live cluster-wide configuration: the driver writes, every executor reads, no server.

Driver:

    cfg = spark_connector.cluster_config(spark)        # after spark_connector.register(spark)
    cfg.set("threshold", 0.7); cfg.update({"flag": True, "model": b"..."}); cfg.delete("old")

Anywhere (UDFs, mapInPandas/mapInArrow, foreachBatch, the driver itself):

    from spark_connector import config
    config.get("threshold", default=0.5); config.snapshot(); config.version(); config.lag()
    config.wait_for(version, timeout=10.0); handle = config.watch(print); handle.stop()

How it works: each node's agent keeps a replica of the configuration (episub.config), a
topic every node of the application joins. A write is one message stamped (version, writer);
the highest stamp of a key wins everywhere, so all replicas converge; an executor agent
started late, or restarted, asks a neighbour for its snapshot (docs/config.md).

Reads come from this process's copy of its node's replica, kept current by a thread
(config_follower.py), so `config.get` costs microseconds and can run once a row.

Which agent a call uses: inside a Spark task, its executor's (found through the deployment
`cluster_config` put in the job's local properties, or, under Spark Connect, the public
deployment `register` put in the session's configuration, or through the executor's
running agent); outside a task, the driver's (the deployment `register` returned).

Under Spark Connect the client process has no node and cannot reach one: outside tasks,
reads and writes run as small Spark jobs beside the driver's node (connect.py), so a
write takes a job's time (tens of milliseconds to a second) and `watch` is not offered
there; tasks read as in classic Spark.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from episub.agent import AgentClient, AgentError, AgentUnavailable, AgentWaitExpired, ConfigView
from spark_connector.config_follower import REATTACH_WAIT, WATCH_POLL, Follower
from spark_connector.connect import (
    SESSION_CONF,
    is_connect,
    reach_nodes,
    read_config,
    spark_error_line,
    write_config,
)
from spark_connector.deployment import (
    AGENT_TIMEOUT,
    Deployment,
    agent_dir,
    driver_client,
    executor_client,
    executor_owner,
    newest_executor_socket,
)

__all__ = [
    "DEFAULT_NAME",
    "DEPLOYMENT_PROPERTY",
    "ClusterConfig",
    "ConfigError",
    "Watch",
    "cluster_config",
    "get",
    "lag",
    "registered_deployment",
    "snapshot",
    "version",
    "wait_for",
    "watch",
]

log = logging.getLogger("spark_connector.config")

DEFAULT_NAME = "default"
# Spark job local property carrying the deployment to tasks (as the pickled reader does),
# classic Spark. Spark writes job properties to its event log (what the UI and the history
# server show), redacting those whose name matches spark.redaction.regex ("secret" does by
# default) and is a key of the SparkConf: `_redact_in_event_log` puts it there.
DEPLOYMENT_PROPERTY = "episub.deployment.secret"
# Spark's default spark.redaction.regex, for when the application has not set its own.
_SPARK_REDACTION_REGEX = "(?i)secret|password|token|access[.]?key"
_driver_deployment: Deployment | None = None  # set by register(), for code outside tasks
_connect_session: Any = None  # the Spark Connect session register() was given, if any


_NO_LAG_ON_CONNECT = (
    "a replica's lag is read from its node, and a Spark Connect client has none: read "
    "config.lag() in tasks (UDFs, mapInPandas...)"
)


class ConfigError(RuntimeError):
    """The configuration cannot be reached or refused a write; the message says why."""


def registered_deployment() -> Deployment | None:
    """The deployment `register()` returned last in this process."""
    return _driver_deployment


def remember_driver_deployment(deployment: Deployment, spark: Any = None) -> None:
    global _driver_deployment, _connect_session
    _driver_deployment = deployment
    _connect_session = spark if spark is not None and is_connect(spark) else None


# -- driver -----------------------------------------------------------------------------------


class ClusterConfig:
    """The driver's handle on configuration `name`; writes return the new version.

    spark: a Spark Connect session, through which reads and writes go (connect.py); for a
    classic one (or None) they go to the driver's agent directly."""

    def __init__(self, deployment: Deployment, name: str = DEFAULT_NAME, spark: Any = None):
        self.deployment = deployment
        self.name = name
        self._connect = spark if spark is not None and is_connect(spark) else None

    def set(self, key: str, value: object) -> int:
        return self._write({key: value}, ())

    def update(self, values: Mapping[str, object]) -> int:
        return self._write(values, ())

    def delete(self, key: str) -> int:
        return self._write({}, (key,))

    def get(self, key: str, default: object = None) -> object:
        return self.snapshot().get(key, default)

    def snapshot(self) -> dict[str, object]:
        return self._read().values

    def version(self) -> int:
        return self._read().version

    def lag(self) -> int:
        """Versions the driver's replica knows exist but does not hold yet (0: caught up)."""
        if self._connect is not None:
            raise ConfigError(_NO_LAG_ON_CONNECT)
        with driver_client(self.deployment) as client:
            return _agent_call(lambda: client.config_read(self.name)).lag

    def _read(self) -> ConfigView:
        if self._connect is not None:
            return _connect_read(self._connect, self.name)  # type: ignore[return-value]
        return _current(self.name, _driver_factory(self.deployment))

    def _write(self, values: Mapping[str, object], deleted: tuple[str, ...]) -> int:
        if self._connect is not None:
            try:
                write_config(self._connect, self.name, values, deleted)
            except TypeError:
                raise  # a value that is neither bytes nor JSON, refused before any job
            except Exception as exc:
                raise ConfigError(
                    f"the configuration write failed on the Spark Connect server: "
                    f"{spark_error_line(exc)}"
                ) from exc
            # The driver's replica after the write: this write's version, or a later one
            # if another writer came in between (either way, one that includes this write).
            return self.version()
        with driver_client(self.deployment) as client:
            view = _agent_call(lambda: client.config_write(self.name, values, deleted))
        # Reads on the driver (here or config.get) see the write once set() has returned.
        _follower(self.name, _driver_factory(self.deployment)).offer(view)
        return view.version

    def __repr__(self) -> str:
        return f"ClusterConfig(name={self.name!r}, bootstrap={self.deployment.bootstrap})"


def cluster_config(
    spark: Any, name: str = DEFAULT_NAME, deployment: Deployment | None = None
) -> ClusterConfig:
    """The configuration `name` of this application, for the driver (or a Spark Connect
    client) to write.

    Call it before starting the jobs or queries whose tasks read it: it starts the driver's
    replica (executors join the configuration through it), and makes sure tasks find their
    executor's agent even when no episub query started it: classic Spark, by putting the
    deployment in this thread's job properties; Spark Connect, by a job that starts an
    agent and its replica on every executor (the session's configuration, which reaches
    every task, may not carry the key: connect.py)."""
    deployment = deployment or _driver_deployment
    if deployment is None:
        raise ConfigError("no episub deployment: call spark_connector.register(spark) first")
    config = ClusterConfig(deployment, name, spark)
    if is_connect(spark):
        config.version()  # the driver's replica first: executors' replicas sync from it
        reach_nodes(spark, driver=False, config=name)
    else:
        _redact_in_event_log(spark.sparkContext)
        spark.sparkContext.setLocalProperty(DEPLOYMENT_PROPERTY, deployment.to_json())
        config.version()  # starts the driver's replica
    return config


def _redact_in_event_log(sc: Any) -> None:
    """Make Spark redact DEPLOYMENT_PROPERTY in the event log: it redacts a job property
    only if the SparkConf has its key (EventLoggingListener.redactProperties), so the key
    goes into the running context's own SparkConf (`sc._conf` wraps it, not a copy), empty."""
    conf = sc._conf
    if not conf.contains(DEPLOYMENT_PROPERTY):
        conf.set(DEPLOYMENT_PROPERTY, "")
    pattern = conf.get("spark.redaction.regex", _SPARK_REDACTION_REGEX)
    try:
        redacted = re.search(pattern, DEPLOYMENT_PROPERTY) is not None
    except re.error:
        redacted = True  # Java regex syntax Python cannot read: trust it
    if not redacted:
        log.warning(
            "spark.redaction.regex (%s) does not match %r: Spark's event log will show the "
            "episub deployment key in the properties of jobs that read live configuration",
            pattern, DEPLOYMENT_PROPERTY,
        )  # fmt: skip


def _connect_read(
    spark: Any, name: str, min_version: int = 0, timeout: float = 0.0
) -> ConfigView | None:
    try:
        return read_config(spark, name, min_version, timeout)
    except Exception as exc:
        raise ConfigError(
            f"the configuration cannot be read through the Spark Connect server: "
            f"{spark_error_line(exc)}"
        ) from exc


# -- anywhere ---------------------------------------------------------------------------------


def get(key: str, default: object = None, name: str = DEFAULT_NAME) -> object:
    """The value of `key` in this node's replica, or `default` when it has none.

    Cheap enough per row: served from this process's copy of the replica, which trails it
    by one local round trip (config_follower.py)."""
    return _current(name).values.get(key, default)


def snapshot(name: str = DEFAULT_NAME) -> dict[str, object]:
    """Every live key and its value, as this node's replica holds them now."""
    return dict(_current(name).values)


def version(name: str = DEFAULT_NAME) -> int:
    """The version this node's replica holds every write up to; it never goes backwards."""
    return _current(name).version


def lag(name: str = DEFAULT_NAME) -> int:
    """How many versions this node's replica knows exist but does not hold yet: 0 once it
    is caught up, above 0 while it repairs a gap (a write it missed while cut off, say).
    Asks the agent each call: for monitoring, not for every row."""
    if _on_connect_client():
        raise ConfigError(_NO_LAG_ON_CONNECT)
    return _read(name).lag


def wait_for(version: int, timeout: float, name: str = DEFAULT_NAME) -> bool:
    """Wait until this node's replica reaches `version` (at most `timeout` s); False if not.
    True means `get`, `snapshot` and `version` in this process see that version or later."""
    if _on_connect_client():
        return _connect_read(_connect_session, name, version, timeout) is not None
    follower = _follower(name)
    if follower.current() is None:
        _read(name)  # the first read of this process starts its copy
    deadline = time.monotonic() + timeout
    # While the copy is kept current, waiting on it costs the agent nothing more.
    reached = follower.wait_for(version, timeout)
    if reached is not None:
        return reached
    try:
        _read(name, version, max(0.0, deadline - time.monotonic()))
    except ConfigError as exc:
        if isinstance(exc.__cause__, AgentWaitExpired):
            return False
        raise
    return True


class Watch:
    """A watcher thread calling back on every new version; `stop()` ends it (it is a daemon,
    so it never holds a worker process open). It follows this process's copy of the
    configuration (config_follower.py), so it costs the agent no connection of its own."""

    def __init__(
        self,
        callback: Callable[[int, dict[str, object]], None],
        name: str,
        client: Callable[[], AgentClient],
    ) -> None:
        self._callback = callback
        self._name = name
        self._client_factory = client
        self._follower = _follower(name, client)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"episub-watch-{name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        seen = -1
        while not self._stopped.is_set():
            view = self._follower.current()
            if view is None:  # the copy is not kept current (first use, agent gone)
                try:
                    view = _read(self._name, factory=self._client_factory)
                except ConfigError as exc:
                    log.warning("config watch of %r: %s; trying again", self._name, exc)
                    self._stopped.wait(REATTACH_WAIT)
                    continue
            if view.version > seen:
                seen = view.version
                try:
                    self._callback(view.version, view.values)
                except Exception:
                    log.exception("config watch of %r: its callback failed; it stops", self._name)
                    return
            # None: the copy is not kept current (its agent went away); read the agent.
            self._follower.wait_for(seen + 1, WATCH_POLL, attach_grace=2 * REATTACH_WAIT)


def watch(callback: Callable[[int, dict[str, object]], None], name: str = DEFAULT_NAME) -> Watch:
    """Call `callback(version, snapshot)` now and on every new version, from a thread."""
    if _on_connect_client():
        raise ConfigError(
            "config.watch follows a node, and a Spark Connect client has none: watch in "
            "tasks (UDFs, mapInPandas...), or poll cluster_config(spark).version()"
        )
    return Watch(callback, name, _client_factory())


# -- plumbing ---------------------------------------------------------------------------------

_followers: dict[tuple[int, object, str], Follower] = {}  # (pid, agent factory, name) -> copy
_factories: dict[tuple[str, str], Callable[[], AgentClient]] = {}  # one per agent, kept
_lock = threading.Lock()  # guards _followers and _factories


def _follower(name: str, factory: Callable[[], AgentClient] | None = None) -> Follower:
    factory = factory or _client_factory()
    # A forked process must not use its parent's copies (their threads stayed behind).
    key = (os.getpid(), factory, name)
    with _lock:
        follower = _followers.get(key)
        if follower is None:
            follower = _followers[key] = Follower(name, factory)
        return follower


def _factory(
    kind: str, where: str, make: Callable[[], Callable[[], AgentClient]]
) -> Callable[[], AgentClient]:
    """The one client factory of an agent (so its copies are found again): made once per
    process by `make`, then kept."""
    with _lock:
        factory = _factories.get((kind, where))
        if factory is None:
            factory = _factories[(kind, where)] = make()
        return factory


def _driver_factory(deployment: Deployment) -> Callable[[], AgentClient]:
    def make() -> Callable[[], AgentClient]:
        def driver() -> AgentClient:
            return driver_client(deployment)

        return driver

    return _factory("driver", deployment.driver_socket, make)


def _on_connect_client() -> bool:
    """Outside any task, in a Spark Connect client's process (it has no node)."""
    if _connect_session is None:
        return False
    from pyspark import TaskContext

    return TaskContext.get() is None


def _current(name: str, factory: Callable[[], AgentClient] | None = None) -> ConfigView:
    """The replica as this process's copy holds it, or as the agent says if the copy is not
    being kept current (first use, or its agent went away); on a Connect client, as the
    driver's replica says."""
    if factory is None and _on_connect_client():
        return _connect_read(_connect_session, name)  # type: ignore[return-value]
    factory = factory or _client_factory()
    view = _follower(name, factory).current()
    return view if view is not None else _read(name, factory=factory)


def _read(
    name: str,
    min_version: int = 0,
    timeout: float = 0.0,
    factory: Callable[[], AgentClient] | None = None,
) -> ConfigView:
    """Ask the agent; the answer also refreshes this process's copy (and starts it).

    Over a connection of its own, closed after: the lasting connections of a process are
    its copies' threads, one per configuration it reads, so a Python worker reading one
    configuration takes one of its agent's client slots (AgentLimits.max_clients, 64).
    Reads get here only when the copy is not kept current (first use, its agent gone), so
    connecting is rare.
    """
    factory = factory or _client_factory()
    for attempt in range(2):
        try:
            with factory() as client:
                view = _agent_call(lambda: client.config_read(name, min_version, timeout))
            break
        except (AgentUnavailable, ConfigError) as exc:
            unavailable = isinstance(exc, AgentUnavailable) or isinstance(
                exc.__cause__, AgentUnavailable
            )
            if not unavailable or attempt == 1:
                if isinstance(exc, AgentUnavailable):
                    raise ConfigError(f"the episub agent cannot be reached: {exc}") from exc
                raise
            # The agent went away as we asked: the next client reaches (or starts) another.
    # The newer of the agent's answer and our copy: an agent restarted a moment ago may
    # answer from behind what this process has already seen, and versions never go back.
    return _follower(name, factory).offer(view)


def _agent_call(call: Callable[[], ConfigView]) -> ConfigView:
    try:
        return call()
    except AgentError as exc:
        raise ConfigError(f"the episub agent refused: {exc}") from exc
    except AgentUnavailable as exc:
        raise ConfigError(f"the episub agent cannot be reached: {exc}") from exc


def _session_deployment() -> Deployment | None:
    """Outside tasks in a process `register` never ran in: under Spark Connect, a server's
    foreachBatch process, beside the driver's agent, whose session configuration has the
    deployment's public form (connect.py). Looked up once per process."""
    global _driver_deployment
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    text = session.conf.get(SESSION_CONF, None) if session is not None else None
    if text:
        _driver_deployment = Deployment.from_json(text)
    return _driver_deployment


def _client_factory() -> Callable[[], AgentClient]:
    """Makes clients of the agent this code should use (see the module doc)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        deployment = _driver_deployment or _session_deployment()
        if deployment is None:
            raise ConfigError(
                "no episub deployment in this process: call spark_connector.register(spark) "
                "on the driver (outside Spark tasks, config calls use the driver's node)"
            )
        return _driver_factory(deployment)
    # Classic: the whole deployment; Connect: its public form (connect.py), which reaches an
    # agent a keyed task started on this executor.
    text = context.getLocalProperty(DEPLOYMENT_PROPERTY) or context.getLocalProperty(SESSION_CONF)
    if text is not None:
        # Once per deployment and process, not per call: config.get runs once a row.
        def make_executor() -> Callable[[], AgentClient]:
            deployment = Deployment.from_json(text)

            def executor() -> AgentClient:
                return executor_client(deployment)

            return executor

        return _factory("executor", text, make_executor)
    socket_path = newest_executor_socket(agent_dir(), executor_owner())
    if socket_path is None:
        raise ConfigError(
            "this task cannot find its executor's episub agent: call "
            "spark_connector.cluster_config(spark) on the driver before starting the job"
        )

    def make_running() -> Callable[[], AgentClient]:
        def running() -> AgentClient:
            return AgentClient(socket_path, timeout=AGENT_TIMEOUT)

        return running

    return _factory("running", socket_path, make_running)
