"""`overlay(spark)`: the application's nodes, as each reports itself.

The driver's node answers from the planner beside it; executors' nodes are asked by small
Spark jobs whose tasks each inspect their own executor's agent (starting it if no task has
yet). Spark places tasks where it likes, so the job is repeated (bounded) until every
executor that Spark reports has answered (connect.py, `reach_nodes`). Both run as jobs of
the `episub_control` data source, so this works alike from a classic session and from a
Spark Connect client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spark_connector.connect import reach_nodes
from spark_connector.deployment import Deployment

__all__ = ["NodeView", "overlay"]


@dataclass(frozen=True, slots=True)
class NodeView:
    role: str  # "driver" or "executor"
    node_id: str  # hex; what tells nodes apart (pids repeat across hosts and containers)
    pid: int  # the agent process, in its host's pid namespace
    address: str
    neighbors: list[dict[str, Any]]  # {address, kind, role, rtt_ms} on the cluster topic
    stats: dict[str, int]
    # Where its agent serves Prometheus metrics (register(spark, metrics=True)); "" if not.
    metrics_url: str = ""


def overlay(spark: Any, deployment: Deployment | None = None) -> list[NodeView]:
    """The driver's node, then one view per executor node (by node id), of the deployment
    `register(spark)` registered last; `deployment`, if given, must be that one."""
    from spark_connector.config import registered_deployment

    if deployment is not None and deployment != registered_deployment():
        raise ValueError(
            "overlay() shows the deployment spark_connector.register(spark) registered last "
            "in this process; this one is another"
        )
    return [NodeView(**view) for view in reach_nodes(spark, driver=True)]
