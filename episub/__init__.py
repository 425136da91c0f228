"""episub: proximity-aware epidemic pub/sub (HyParView + GoCast + Plumtree).

The public API is flat (h11's manner): everything an application needs is importable
from `episub`; the modules behind it are an implementation detail.
"""

import warnings

from episub.net.link_delay import zones_link_delay
from episub.net.runtime import CoreError
from episub.node import BootstrapError, Neighbor, Node, Receipt
from episub.proto.config import BroadcastConfig, MembershipConfig, NodeConfig
from episub.proto.envelope import Record
from episub.proto.errors import LocalProtocolError, MessageTooLarge
from episub.records import format_publisher, parse_publisher
from episub.retention import RetentionConfig
from episub.subscription import Delivery, Lagged, Lost, Subscription

__version__ = "0.1.0"

# Names that were renamed: still importable, with a DeprecationWarning saying the new one.
_RENAMED = {"Message": ("Delivery", Delivery)}


def __getattr__(name: str) -> object:
    if name in _RENAMED:
        new, value = _RENAMED[name]
        warnings.warn(
            f"episub.{name} is deprecated: use episub.{new}", DeprecationWarning, stacklevel=2
        )
        return value
    raise AttributeError(f"module 'episub' has no attribute {name!r}")


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
    "Neighbor",
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
