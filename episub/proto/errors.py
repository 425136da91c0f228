"""Errors the core raises. Only the caller's misuse raises (h11's LocalProtocolError); a
peer's bad input never does: it is dropped and reported as a `PeerMisbehaved` output."""

from __future__ import annotations


class LocalProtocolError(Exception):
    """The caller used the core wrongly (publish to a topic it has not joined, say)."""


class MessageTooLarge(LocalProtocolError, ValueError):
    """A publish over `max_message_size`."""


class OwnStreamNamed(LocalProtocolError, ValueError):
    """A publish naming this node's own stream as its place: the core numbers that one."""


def too_large(size: int, limit: int, topic: str) -> str:
    """MessageTooLarge's message: the size, the limit, and how to raise it."""
    return (
        f"message of {size} bytes exceeds max_message_size ({limit} bytes) on topic "
        f"{topic!r}; raise it alike on every node of the deployment: "
        '{"broadcast": {"max_message_size": BYTES}} in `episub node --config FILE`, '
        "or NodeConfig(broadcast=BroadcastConfig(max_message_size=BYTES))"
    )
