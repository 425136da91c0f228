"""One episub node as an OS process, for benchmarks/loopback.py -- STUB, NOT WIRED YET.

    .venv/bin/python benchmarks/loopback.py --system episub --nodes 8 --size 256 --messages 2000

*** This file is a placeholder. *** episub's network runtime (``episub.net``,
``episub.node``) is being written; until ``import episub.node`` provides a ``Node`` class
this script prints "episub runtime not available yet" on stderr and exits with status 3,
which loopback.py reports as "system not available". Once ``Node`` exists the adapter
below must be completed (every method marked TODO); until then it exits with status 3 too,
saying so.

The contract is the one documented at the top of loopback.py and implemented by
peer_common.drive: the adapter only has to listen on 127.0.0.1:--port and return a dialable
address string (``host:port`` is fine), join the overlay through the BOOTSTRAP addresses
(node I gets the addresses of nodes 0..I-1; HyParView needs only one of them as contact),
report readiness, publish bytes, hand delivered payloads to ``receive`` and keep the three
counters: ``payload_copies`` (payload-carrying frames received, first copies plus
duplicates; Plumtree's eager pushes and GRAFT replies), ``wire_read`` / ``wire_written``
(bytes read from / written to the node's TCP sockets). A counter that cannot be had stays
None and the harness prints "-".
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from typing import Any

import peer_common
import trio

STATUS_UNAVAILABLE = 3


def load_node_class() -> type | None:
    try:
        module = importlib.import_module("episub.node")
    except ImportError:
        return None
    node_cls = getattr(module, "Node", None)
    return node_cls if isinstance(node_cls, type) else None


class EpisubAdapter:
    """TODO(lead): fill in against episub.node.Node once the runtime lands."""

    system = "episub"
    IMPLEMENTED = False  # TODO(lead): set True once every TODO method below is written

    def __init__(self, args: Any, node_cls: type) -> None:
        self.args = args
        self.node_cls = node_cls
        self.payload_copies: int | None = None  # TODO: from the node's counters
        self.wire_read: int | None = None  # TODO: bytes read on the node's sockets
        self.wire_written: int | None = None  # TODO: bytes written on the node's sockets

    # Hints from episub/node.py as of this writing (check them against the landed API):
    # ``async with Node(key=KEY, listen=f"127.0.0.1:{port}") as node`` (one fixed 32-byte
    # KEY for the whole run), ``node.address``, ``await node.join(topic, bootstrap)``,
    # ``node.subscribe(topic, buffer=...)`` (raise the buffer to M*K so the benchmark
    # never sees Lagged, as gossipsub_peer.py lifts py-libp2p's 32), ``await
    # node.publish(topic, data)``, ``node.neighbors(topic)``, ``node.stats()`` (counters
    # for payload copies and socket bytes, or add them to the runtime).

    async def listen(self, nursery: trio.Nursery) -> str:
        # TODO: enter the Node in a task started with ``await nursery.start(...)`` (as
        # GossipsubAdapter._run does) and open the subscription there; return the
        # "host:port" other episub peers dial.
        raise NotImplementedError

    async def connect(self, addrs: list[str]) -> None:
        # TODO: join the topic through these addresses (an empty list starts the overlay).
        raise NotImplementedError

    async def wait_ready(self) -> None:
        # TODO: return once joined and the active view holds min(target, N-1) neighbours;
        # poll with a short trio.sleep (the driver's --deadline bounds it), no fixed delay.
        raise NotImplementedError

    async def publish(self, data: bytes) -> None:
        raise NotImplementedError  # TODO: node.publish(self.args.topic, data)

    async def receive(self) -> bytes:
        raise NotImplementedError  # TODO: next delivered Message's value (skip Lost items)

    def config(self) -> dict[str, Any]:
        return {"note": "TODO: record episub's overlay and broadcast parameters"}

    def versions(self) -> dict[str, str]:
        out = {"trio": importlib.metadata.version("trio")}
        try:
            out["episub"] = importlib.metadata.version("episub")
        except importlib.metadata.PackageNotFoundError:
            out["episub"] = "source tree"
        return out


def main() -> int:
    args = peer_common.parse_args()
    node_cls = load_node_class()
    if node_cls is None:
        print("episub runtime not available yet", file=sys.stderr)
        return STATUS_UNAVAILABLE
    if not EpisubAdapter.IMPLEMENTED:
        print(
            "episub runtime not available yet: episub.node.Node exists but "
            "benchmarks/episub_peer.py's adapter is still a stub",
            file=sys.stderr,
        )
        return STATUS_UNAVAILABLE
    trio.run(peer_common.drive, EpisubAdapter(args, node_cls), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
