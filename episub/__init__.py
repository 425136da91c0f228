"""episub: proximity-aware epidemic pub/sub (HyParView + GoCast + Plumtree).

The public API is flat (h11's manner): everything an application needs is importable
from `episub`; the modules behind it are an implementation detail.

The face costs nothing to import: names whose modules load trio (the node, its
subscriptions, the runtime's `CoreError`) are imported on first use (PEP 562), so a
Spark worker that imports only the agent's blocking client never loads trio.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING

from episub.net.link_delay import zones_link_delay
from episub.proto.config import BroadcastConfig, MembershipConfig, NodeConfig
from episub.proto.envelope import Record
from episub.proto.errors import LocalProtocolError, MessageTooLarge
from episub.proto.store import RetentionConfig
from episub.records import (
    Delivery,
    Lagged,
    Lost,
    NeighborLink,
    Receipt,
    format_publisher,
    parse_publisher,
)

if TYPE_CHECKING:
    from episub.net.runtime import CoreError
    from episub.node import BootstrapError, Node
    from episub.subscription import Subscription

__version__ = "0.1.0"

# Public names whose modules import trio: loaded by __getattr__ when first asked for.
_LAZY = {
    "BootstrapError": "episub.node",
    "CoreError": "episub.net.runtime",
    "Node": "episub.node",
    "Subscription": "episub.subscription",
}

# Names that were renamed: still importable, with a DeprecationWarning saying the new one.
_RENAMED = {"Message": "Delivery"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups find it without coming here
        return value
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(
            f"episub.{name} is deprecated: use episub.{new}", DeprecationWarning, stacklevel=2
        )
        return globals()[new]
    raise AttributeError(f"module 'episub' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BootstrapError",
    "BroadcastConfig",
    "CoreError",
    "Delivery",
    "Lagged",
    "LocalProtocolError",
    "Lost",
    "MembershipConfig",
    "MessageTooLarge",
    "NeighborLink",
    "Node",
    "NodeConfig",
    "Receipt",
    "Record",
    "RetentionConfig",
    "Subscription",
    "format_publisher",
    "parse_publisher",
    "zones_link_delay",
]
