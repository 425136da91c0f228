"""Live configuration replicated over a topic: every node converges to one snapshot.

- `state`: one replica's key -> entry map and its merge rule (plain data, no I/O).
- `codec`: the update / sync / snapshot messages replicas exchange on the topic.
- `replica`: a replica kept by a running `Node` (trio): applies what arrives, asks a
  neighbour for its snapshot when it joins late or notices a gap, answers such requests.

`replica` imports trio and the node: its names load on first use (PEP 562), so the agent's
blocking client reads `codec` and `state` inside a Spark worker without loading trio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from episub.config.codec import ConfigCodecError
from episub.config.state import ConfigLimitError, ConfigState, Entry

if TYPE_CHECKING:
    from episub.config.replica import DELETE, ConfigReplica, config_topic

_FROM_REPLICA = ("DELETE", "ConfigReplica", "config_topic")


def __getattr__(name: str) -> object:
    if name in _FROM_REPLICA:
        value = getattr(importlib.import_module("episub.config.replica"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'episub.config' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FROM_REPLICA))


__all__ = [
    "DELETE",
    "ConfigCodecError",
    "ConfigLimitError",
    "ConfigReplica",
    "ConfigState",
    "Entry",
    "config_topic",
]
