"""The agent: a node as a local service, and its clients.

A Spark executor's Python workers are short-lived and pickled (docs/how-it-works.md,
"Why an agent"), so a node cannot live in one: it lives in an agent process per executor,
started on first use by `ensure_agent` (under a file lock, so one per socket path), reached
by workers with the blocking `AgentClient` over a Unix socket, and gone on its own when its
owner process ends or nobody has used it for a while.

- `server`, `service`: the agent process's socket and what its requests do (trio).
- `client`: the blocking client (no event loop: it runs inside Spark workers); `errors`:
  what it raises, a class per cause.
- `launcher`: `ensure_agent`, start-or-attach.
- `wire`, agent.proto: the length-prefixed protobuf protocol between the two.
- `runner`, `cli`, `tools`, `options`: the `episub node/agent/publish/subscribe/inspect`
  commands.
"""

import warnings

from episub.agent.client import AgentClient, AgentStatus, AgentSubscription, ConfigView
from episub.agent.errors import (
    AgentAtLimit,
    AgentBadRequest,
    AgentBootstrapFailed,
    AgentError,
    AgentInternalError,
    AgentTimeout,
    AgentTooLarge,
    AgentUnavailable,
    AgentWaitExpired,
)
from episub.agent.launcher import AgentInfo, ensure_agent
from episub.agent.wire import Record
from episub.records import Receipt

__all__ = [
    "AgentAtLimit",
    "AgentBadRequest",
    "AgentBootstrapFailed",
    "AgentClient",
    "AgentError",
    "AgentInfo",
    "AgentInternalError",
    "AgentStatus",
    "AgentSubscription",
    "AgentTimeout",
    "AgentTooLarge",
    "AgentUnavailable",
    "AgentWaitExpired",
    "ConfigView",
    "Receipt",
    "Record",
    "ensure_agent",
]

# Names that were renamed: still importable, with a DeprecationWarning saying the new one.
_RENAMED = {"Published": ("Receipt", Receipt)}


def __getattr__(name: str) -> object:
    if name in _RENAMED:
        new, value = _RENAMED[name]
        warnings.warn(
            f"episub.agent.{name} is deprecated: use episub.agent.{new} (the node's Receipt)",
            DeprecationWarning,
            stacklevel=2,
        )
        return value
    raise AttributeError(f"module 'episub.agent' has no attribute {name!r}")
