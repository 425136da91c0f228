"""The agent: a node as a local service, and its clients.

A Spark executor's Python workers are short-lived and pickled (DESIGN.md, "Spark facts"),
so a node cannot live in one: it lives in an agent process per executor, started on first
use by `ensure_agent` (under a file lock, so one per socket path), reached by workers with
the blocking `AgentClient` over a Unix socket, and gone on its own when its owner process
ends or nobody has used it for a while.

- `server`, `service`: the agent process's socket and what its requests do (trio).
- `client`: the blocking client (no event loop: it runs inside Spark workers).
- `launcher`: `ensure_agent`, start-or-attach.
- `wire`, agent.proto: the length-prefixed protobuf protocol between the two.
- `runner`, `cli`, `tools`, `options`: the `episub node/agent/publish/subscribe/inspect`
  commands.
"""

from episub.agent.client import (
    AgentClient,
    AgentError,
    AgentStatus,
    AgentSubscription,
    AgentTimeout,
    AgentUnavailable,
    ConfigView,
)
from episub.agent.launcher import AgentInfo, ensure_agent
from episub.agent.wire import Published, Record

__all__ = [
    "AgentClient",
    "AgentError",
    "AgentInfo",
    "AgentStatus",
    "AgentSubscription",
    "AgentTimeout",
    "AgentUnavailable",
    "ConfigView",
    "Published",
    "Record",
    "ensure_agent",
]
