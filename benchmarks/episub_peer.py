"""One episub node as an OS process, for benchmarks/loopback.py.

    .venv/bin/python benchmarks/loopback.py --system episub --nodes 8 --size 256 --messages 2000

The contract is the one documented at the top of loopback.py and implemented by
peer_common.drive: listen on 127.0.0.1:--port and return a dialable "host:port", join the
overlay through the first BOOTSTRAP address (HyParView needs one contact), report readiness
once a few links are up, publish bytes, hand delivered payloads to ``receive`` and keep the
three counters: ``payload_copies`` (GOSSIP frames received, first copies plus duplicates),
``wire_read`` / ``wire_written`` (frame bytes on the node's connections, from
``node.stats()``). Every node runs episub's defaults, sealed frames included; with
EPISUB_BENCH_SIGNED=1 in its environment (loopback.py --signed), signed publishing too.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
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


KEY = bytes(range(32))  # one deployment key for the whole run
SIGNED = os.environ.get("EPISUB_BENCH_SIGNED") == "1"  # loopback.py --signed
READY_TIMEOUT = 60.0  # s a node waits for its view to fill; the driver's --deadline bounds all
SUBSCRIPTION_SLACK = 1024  # items beyond the run's total, so the benchmark never lags


class EpisubAdapter:
    """One episub Node (episub.node) in this process, subscribed to the run's topic."""

    system = "episub"
    IMPLEMENTED = True

    def __init__(self, args: Any, node_cls: type) -> None:
        self.args = args
        self.node_cls = node_cls
        self.node: Any = None
        self.sub: Any = None

    def _stat(self, *names: str) -> int | None:
        if self.node is None:
            return None
        stats = self.node.stats()
        return sum(stats[name] for name in names)

    # Payload-carrying frames received: first copies plus duplicates (GOSSIP in any form:
    # eager push, GRAFT answer, PULL answer).
    @property
    def payload_copies(self) -> int | None:
        return self._stat("gossip_received", "duplicates_received")

    # Frame bytes read and written on the node's connections (handshakes not included;
    # with sealing on, each record adds 20 bytes on the wire: 4 of length, 16 of tag).
    @property
    def wire_read(self) -> int | None:
        return self._stat("bytes_in")

    @property
    def wire_written(self) -> int | None:
        return self._stat("bytes_out")

    async def listen(self, nursery: trio.Nursery) -> str:
        ready = trio.Event()

        async def run() -> None:
            node = self.node_cls(key=KEY, listen=f"127.0.0.1:{self.args.port}", sign=SIGNED)
            async with node:
                self.node = node
                buffer = self.args.publishers * self.args.messages + SUBSCRIPTION_SLACK
                async with node.subscribe(self.args.topic, buffer) as sub:
                    self.sub = sub
                    ready.set()
                    await trio.sleep_forever()

        nursery.start_soon(run)
        await ready.wait()
        return self.node.address

    async def connect(self, addrs: list[str]) -> None:
        await self.node.join(self.args.topic, bootstrap=addrs[:1])

    async def wait_ready(self) -> None:
        want = min(3, self.args.nodes - 1)  # a few links: the overlay around us carries
        with trio.move_on_after(READY_TIMEOUT):
            while len(self.node.neighbors(self.args.topic)) < want:
                await trio.sleep(0.05)

    async def publish(self, data: bytes) -> None:
        await self.node.publish(self.args.topic, data)

    async def publish_many(self, batch: list[bytes]) -> None:
        await self.node.publish_many(self.args.topic, batch)

    async def receive_batch(self) -> list[bytes]:
        from episub.subscription import Delivery

        while True:
            batch = [
                item.value for item in await self.sub.receive_batch() if type(item) is Delivery
            ]
            if batch:
                return batch

    def config(self) -> dict[str, Any]:
        from episub.proto.config import NodeConfig

        config = NodeConfig()
        return {
            "active_view": f"C_rand={config.membership.c_rand} C_near={config.membership.c_near}",
            "ihave_interval_s": config.broadcast.ihave_interval,
            "sealed_frames": True,
            "signed": SIGNED,
            "note": "defaults throughout; own publications are delivered to own subscribers",
            "node_stats": self.node.stats() if self.node is not None else None,
        }

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
