"""What a client of the agent can be told went wrong, a class per cause (h11's manner: whose
fault it is, and why, is the type, never a string to compare).

- `AgentUnavailable`: no agent answers, or the connection to it was lost; `AgentTimeout`,
  one of them: the client gave up waiting for a reply (the connection is closed then).
- `AgentError`: the agent answered with a refusal; the connection stays usable. Its
  subclasses name the cause the agent gave (Error.kind in agent.proto): `AgentBadRequest`,
  `AgentBootstrapFailed`, `AgentWaitExpired` (the agent's own wait ran out, as opposed to
  the client's), `AgentTooLarge`, `AgentAtLimit`, `AgentInternalError`.
"""

from __future__ import annotations

from typing import ClassVar

from episub.records import Receipt

__all__ = [
    "AgentAtLimit",
    "AgentBadRequest",
    "AgentBootstrapFailed",
    "AgentError",
    "AgentInternalError",
    "AgentTimeout",
    "AgentTooLarge",
    "AgentUnavailable",
    "AgentWaitExpired",
    "agent_error",
]


class AgentUnavailable(ConnectionError):
    """No agent answers at the socket, or the connection to it was lost."""


class AgentTimeout(AgentUnavailable, TimeoutError):
    """The client gave up: the agent did not answer a request within the client's timeout."""


class AgentError(Exception):
    """The agent refused or failed a request; catch a subclass for one cause.

    `kind` is the cause's name on the wire (Error.kind, agent.proto); `published` lists
    what a publish_batch had published before the failing request."""

    kind: ClassVar[str] = "unknown"  # a kind this client does not know keeps the base class

    def __init__(self, message: str, published: list[Receipt] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.published = published or []


class AgentBadRequest(AgentError):
    """The request is malformed or not possible now (a topic not joined, a bad range)."""

    kind = "bad_request"


class AgentBootstrapFailed(AgentError):
    """A join: none of the bootstrap addresses answered."""

    kind = "bootstrap"


class AgentWaitExpired(AgentError):
    """The agent's own wait ran out: a join found no neighbour in time (the topic is joined
    all the same and the node keeps trying), or a configuration read did not see the asked
    version in time. Not `AgentTimeout`, where the client gave up on the agent."""

    kind = "timeout"


class AgentTooLarge(AgentError):
    """A record or a configuration write is past its bound; nothing of it was done."""

    kind = "too_large"


class AgentAtLimit(AgentError):
    """The agent is at one of its bounds (clients, subscriptions): try again later."""

    kind = "limit"


class AgentInternalError(AgentError):
    """The agent (or the client, on an answer that makes no sense) failed: a bug."""

    kind = "internal"


_BY_KIND: dict[str, type[AgentError]] = {
    cls.kind: cls
    for cls in (
        AgentBadRequest,
        AgentBootstrapFailed,
        AgentWaitExpired,
        AgentTooLarge,
        AgentAtLimit,
        AgentInternalError,
    )
}


def agent_error(kind: str, message: str) -> AgentError:
    """The error for a refusal the agent sent: its class by `kind`, or the base class, with
    the kind said in the message, for a kind this client does not know."""
    cls = _BY_KIND.get(kind)
    if cls is None:
        return AgentError(f"{kind}: {message}")
    return cls(message)
