"""The stream and topic names episub keeps for itself, spelled once.

A named stream's publisher is bytes on the wire and text in a Spark offset; both spellings
are here. Application streams and topics must not start with the control prefixes.
"""

from __future__ import annotations

__all__ = [
    "CLUSTER_TOPIC",
    "CONFIG_TOPIC_PREFIX",
    "CONTROL_PREFIX",
    "CONTROL_PREFIX_TEXT",
    "INTERNAL_TOPIC_PREFIX",
    "SINK_INDEX_PREFIX",
    "SINK_PREFIX",
    "is_internal_stream",
    "sink_stream",
]

# Streams whose publisher starts with this carry a deployment's own bookkeeping (a Spark
# sink's batch index): held, relayed and readable by range like any message, never
# delivered to subscriptions or listeners.
CONTROL_PREFIX = b"_episub/"
CONTROL_PREFIX_TEXT = CONTROL_PREFIX.decode()  # the same, as offsets spell publishers
SINK_INDEX_PREFIX = CONTROL_PREFIX + b"sink/"  # + query id: a Spark sink's batch index
# A Spark sink partition's rows: sink/<query>/<generation>/<partition> (sink_stream).
SINK_PREFIX = b"sink/"

# Topics whose names start so are the deployment's own.
INTERNAL_TOPIC_PREFIX = "_episub."
# Every Spark node of a deployment joins this topic as soon as it starts, so the overlay
# (and its RTT measurements) exists before any query runs; introspection and live
# configuration ride on it.
CLUSTER_TOPIC = INTERNAL_TOPIC_PREFIX + "cluster"
CONFIG_TOPIC_PREFIX = INTERNAL_TOPIC_PREFIX + "config."  # + name: live configuration


def sink_stream(query: str, generation: int, partition: int) -> bytes:
    """The stream one sink partition publishes its rows on (stable across task retries)."""
    return SINK_PREFIX + f"{query}/{generation}/{partition}".encode()


def is_internal_stream(publisher: bytes) -> bool:
    """Is this stream a sink's or a control stream, rather than a node's own?"""
    return publisher.startswith((SINK_PREFIX, CONTROL_PREFIX))
