"""episub: proximity-aware epidemic pub/sub (HyParView + GoCast + Plumtree).

The public API is flat (h11's manner): everything an application needs is importable
from `episub`; the modules behind it are an implementation detail.
"""

from episub.net.link_delay import zones_link_delay
from episub.net.runtime import CoreError
from episub.node import BootstrapError, Neighbor, Node
from episub.proto.config import BroadcastConfig, MembershipConfig, NodeConfig
from episub.proto.envelope import Record
from episub.proto.errors import LocalProtocolError, MessageTooLarge
from episub.retention import RetentionConfig
from episub.subscription import Lagged, Lost, Message, Subscription

__version__ = "0.1.0"

__all__ = [
    "BootstrapError",
    "BroadcastConfig",
    "CoreError",
    "Lagged",
    "LocalProtocolError",
    "Lost",
    "MembershipConfig",
    "Message",
    "MessageTooLarge",
    "Neighbor",
    "Node",
    "NodeConfig",
    "Record",
    "RetentionConfig",
    "Subscription",
    "zones_link_delay",
]
