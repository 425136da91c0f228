"""`overlay(spark)`: the application's nodes, as each reports itself.

The driver's node answers directly; executors' nodes are asked by a small Spark job whose
tasks each inspect their own executor's agent (starting it if no task has yet). Spark
places tasks where it likes, so the job is repeated (bounded) until every executor that
Spark reports has answered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spark_connector.deployment import (
    CLUSTER_TOPIC,
    Deployment,
    driver_client,
    executor_client,
)

__all__ = ["NodeView", "overlay"]

ATTEMPTS = 10  # jobs at most; guess: two or three reach every executor of a small cluster


@dataclass(frozen=True, slots=True)
class NodeView:
    role: str  # "driver" or "executor"
    pid: int  # the agent process
    address: str
    neighbors: list[dict[str, Any]]  # {address, kind, role, rtt_ms} on the cluster topic
    stats: dict[str, int]


def _view(role: str, client: Any) -> NodeView:
    status = client.inspect()
    neighbors = [
        {"address": n.address, "kind": n.kind, "role": n.role, "rtt_ms": n.rtt_ms}
        for n in status.topics.get(CLUSTER_TOPIC, [])
    ]
    return NodeView(role, status.pid, status.address, neighbors, status.stats)


def _inspect_executor(deployment: Deployment) -> NodeView:
    with executor_client(deployment) as client:
        return _view("executor", client)


def overlay(spark: Any, deployment: Deployment) -> list[NodeView]:
    """The driver's node, then one view per executor node (by agent pid)."""
    with driver_client(deployment) as client:
        views = [_view("driver", client)]
    sc = spark.sparkContext
    executors = max(1, sc._jsc.sc().getExecutorMemoryStatus().size() - 1)  # minus the driver
    if sc.master.startswith("local["):
        executors = 1  # the driver's JVM is the one executor
    found: dict[int, NodeView] = {}
    slices = 4 * executors
    for _ in range(ATTEMPTS):
        rdd = sc.parallelize(range(slices), slices)
        for view in rdd.map(lambda _: _inspect_executor(deployment)).collect():
            found[view.pid] = view
        if len(found) >= executors:
            break
    return views + sorted(found.values(), key=lambda v: v.pid)
