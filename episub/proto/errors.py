"""Errors the core raises. Only the caller's misuse raises (h11's LocalProtocolError); a
peer's bad input never does: it is dropped and reported as a `PeerMisbehaved` output."""

from __future__ import annotations


class LocalProtocolError(Exception):
    """The caller used the core wrongly (publish to a topic it has not joined, say)."""


class MessageTooLarge(LocalProtocolError, ValueError):
    """A publish over `max_message_size`."""
