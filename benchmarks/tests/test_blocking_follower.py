"""benchmarks/blocking_follower.py, the prototype follower without trio that
config_broadcast.py measures: it must follow a real writer, or its figures mean nothing."""

from __future__ import annotations

import threading
import time

import trio
from blocking_follower import BlockingFollower  # benchmarks/ (conftest.py)

from episub import Node
from episub.config import ConfigReplica, config_topic
from episub.config.codec import value_of

KEY = bytes(range(32))  # the deployment key every node of the test shares

WRITES = 20


def joined(follower: BlockingFollower, limit: float = 10.0) -> BlockingFollower:
    """Pump `follower` until a neighbour accepted it (its NeighborUp), at most `limit` s."""
    deadline = time.monotonic() + limit
    while not follower.neighbors:
        assert time.monotonic() < deadline, "the writer never accepted the follower"
        follower.step(0.1)
    return follower


def test_the_prototype_follows_every_write_of_a_trio_writer_over_tcp() -> None:
    async def main() -> None:
        async with Node(key=KEY, listen="127.0.0.1:0") as node, trio.open_nursery() as nursery:
            writer = ConfigReplica(node, "default")
            await nursery.start(writer.run)
            follower = await trio.to_thread.run_sync(
                lambda: joined(BlockingFollower(KEY, config_topic("default"), node.address))
            )
            serving = threading.Thread(target=follower.serve, daemon=True)
            serving.start()
            try:
                for i in range(1, WRITES + 1):
                    await writer.write({"n": i, "name": f"v{i}"})
                reached = await trio.to_thread.run_sync(follower.wait_for, WRITES, 10.0)
                assert reached, f"the follower stopped at version {follower.state.version}"
                entry = follower.state.get("n")
                assert entry is not None and value_of(entry) == WRITES
                assert follower.malformed == 0
            finally:
                follower.stop()
                await trio.to_thread.run_sync(serving.join, 5.0)
                follower.close()
            assert not serving.is_alive()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_trio_replica_applies_every_write_of_the_prototype_writer() -> None:
    async def main() -> None:
        writer = BlockingFollower(KEY, config_topic("default"), None)
        serving = threading.Thread(target=writer.serve, daemon=True)
        try:
            async with Node(key=KEY, listen="127.0.0.1:0") as node, trio.open_nursery() as nursery:
                reader = ConfigReplica(node, "default", bootstrap=[writer.address])
                nursery.start_soon(reader.run)
                # One thread at a time pumps the writer: a worker until the reader is its
                # neighbour and through the writes, then a thread of its own.
                await trio.to_thread.run_sync(joined, writer)
                for i in range(1, WRITES + 1):
                    await trio.to_thread.run_sync(writer.write, {"n": i})
                serving.start()
                assert await reader.wait_for(WRITES, timeout=10.0), reader.state.version
                entry = reader.state.get("n")
                assert entry is not None and value_of(entry) == WRITES
                assert reader.counters["malformed"] == 0
                nursery.cancel_scope.cancel()
        finally:
            writer.stop()
            if serving.is_alive():
                serving.join(5.0)
            writer.close()

    trio.run(main)
