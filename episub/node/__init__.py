"""One episub node: `Node`, the public async API (episub.node.node), and the parts it
composes, one job each:

- lifetime: listen, run the runtime, leave and close on exit.
- bootstrap: dial bootstrap addresses at once, and again when a topic is isolated.
- checks: the caller's arguments, checked once where they enter.
- publishing: a checked batch into the core with flow control; receipts.
- fanout: delivered items to subscriptions (as batches) and listeners.
- fetching: fetch retries, holder after holder, chunk after chunk.
- catchup: compare holdings with a neighbour whose link came up; fetch the difference.
- queries: ask other nodes for their view, holdings and topics.
- retained: the core's message store read back as messages.

Parts never import one another's state: `Node` hands each the core's events it needs.
"""

from episub.node.bootstrap import BOOTSTRAP_GRACE, BootstrapError
from episub.node.fetching import FETCH_TIMEOUT
from episub.node.lifetime import CLOSE_TIMEOUT
from episub.node.node import JOIN_TIMEOUT, Node
from episub.node.publishing import PUBLISH_CHUNK, PUBLISH_WAIT
from episub.node.queries import VIEW_TIMEOUT
from episub.records import HELD_TIMEOUT, SUBSCRIPTION_BUFFER, NeighborLink, Receipt

__all__ = [
    "BOOTSTRAP_GRACE",
    "CLOSE_TIMEOUT",
    "FETCH_TIMEOUT",
    "HELD_TIMEOUT",
    "JOIN_TIMEOUT",
    "PUBLISH_CHUNK",
    "PUBLISH_WAIT",
    "SUBSCRIPTION_BUFFER",
    "VIEW_TIMEOUT",
    "BootstrapError",
    "NeighborLink",
    "Node",
    "Receipt",
]
