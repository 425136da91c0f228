"""Config replicas on real nodes over loopback TCP: convergence, catch-up, races, bad input."""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack

import pytest
import trio

from episub import Node
from episub.config import DELETE, ConfigReplica, config_topic
from episub.config import replica as replica_module
from episub.config.codec import encode_update, entry_for, value_of
from episub.config.replica import write_stream
from episub.net.peer_id import make_peer_id
from episub.records import NeighborLink
from episub.subscription import Delivery
from tests.net_helpers import KEY, fast_config, run, wait_until


async def open_nodes(stack: AsyncExitStack, count: int) -> list[Node]:
    """Nodes are entered before the nursery that runs replicas is opened: they outlive it."""
    return [
        await stack.enter_async_context(Node(key=KEY, config=fast_config())) for _ in range(count)
    ]


async def start_replicas(
    nursery: trio.Nursery, nodes: list[Node], bootstrap: list[str] | None = None
) -> list[ConfigReplica]:
    """A replica on each node, each joining through the first (or `bootstrap`), synced."""
    replicas: list[ConfigReplica] = []
    for node in nodes:
        contacts = bootstrap if bootstrap is not None else [r.node.address for r in replicas[:1]]
        replica = ConfigReplica(node, "default", bootstrap=contacts)
        await nursery.start(replica.run)
        with trio.fail_after(10):
            await replica.synced.wait()
        replicas.append(replica)
    return replicas


def snapshot(replica: ConfigReplica) -> dict[str, object]:
    return {k: value_of(e) for k, e in replica.state.values().items()}


def test_every_replica_reaches_the_last_of_100_versions_and_never_goes_back() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            nodes = await open_nodes(stack, 4)
            async with trio.open_nursery() as nursery:
                writer, *readers = await start_replicas(nursery, nodes)
                seen: dict[int, list[int]] = {i: [] for i in range(len(readers))}

                async def watch(i: int, replica: ConfigReplica) -> None:
                    while True:
                        seen[i].append(replica.state.version)
                        await trio.sleep(0.001)

                for i, replica in enumerate(readers):
                    nursery.start_soon(watch, i, replica)
                for n in range(1, 101):
                    assert await writer.write({"threshold": n, "flag": n % 2 == 0}) == n
                for replica in readers:
                    assert await replica.wait_for(100, timeout=20)
                assert all(snapshot(r) == {"threshold": 100, "flag": True} for r in readers)
                assert all(versions == sorted(versions) for versions in seen.values())
                nursery.cancel_scope.cancel()

    run(main)


def test_a_late_replica_gets_the_snapshot_from_a_neighbour() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            nodes = await open_nodes(stack, 3)
            async with trio.open_nursery() as nursery:
                first, second = await start_replicas(nursery, nodes[:2])
                await first.write({"a": 1, "b": b"\x00", "c": "gone"})
                await first.write({"c": DELETE})
                await wait_until(lambda: second.state.version == 2, what="the second replica")
                [late] = await start_replicas(nursery, nodes[2:], [second.node.address])
                assert late.state.version == 2
                assert snapshot(late) == {"a": 1, "b": b"\x00"}
                assert late.counters["snapshots_merged"] >= 1
                assert first.counters["snapshots_sent"] + second.counters["snapshots_sent"] >= 1
                nursery.cancel_scope.cancel()

    run(main)


def test_two_replicas_starting_together_after_a_write_both_catch_up() -> None:
    """Two executors' replicas started at once (a Spark job's first tasks on both, after
    the driver wrote) ask the bootstrap node, which has the snapshot, first: not each other,
    which have nothing yet (a replica that has not caught up answers that it is not ready,
    never with its empty state)."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            nodes = await open_nodes(stack, 3)
            async with trio.open_nursery() as nursery:
                [seed] = await start_replicas(nursery, nodes[:1])
                await seed.write({"a": 1})
                newcomers = [
                    ConfigReplica(node, "default", bootstrap=[seed.node.address])
                    for node in nodes[1:]
                ]
                async with trio.open_nursery() as starting:
                    for replica in newcomers:
                        starting.start_soon(nursery.start, replica.run)
                for replica in newcomers:
                    with trio.fail_after(20):
                        await replica.synced.wait()
                assert [(r.state.version, snapshot(r)) for r in newcomers] == [(1, {"a": 1})] * 2
                assert [r.asked[:1] for r in newcomers] == [[seed.node.id]] * 2
                nursery.cancel_scope.cancel()

    run(main)


def test_a_starting_replica_asks_its_contact_first_while_its_only_link_is_another_newcomer():
    """join() returns at the topic's first link, which may be another newcomer's (its
    contact walked the JOIN on) before the contact's own link is up: the contact is asked
    first all the same (and last in a repair round, as the driver's node)."""
    seed, other, me = (make_peer_id("127.0.0.1", port) for port in (7001, 7002, 7003))

    class Newcomer:
        id = me

        def neighbors(self, topic: str) -> list[NeighborLink]:
            return [NeighborLink(peer_id=other, address="127.0.0.1:7002", kind="rand",
                             role="eager", rtt_ms=None)]  # fmt: skip

        def contacts(self, topic: str) -> list[bytes]:
            return [seed]

    replica = ConfigReplica(Newcomer(), "default", bootstrap=["127.0.0.1:7001"])  # type: ignore[arg-type]
    assert [peer for peer, _ in replica._candidates(first=True)] == [seed, other]
    assert [peer for peer, _ in replica._candidates(first=False)] == [other, seed]


def test_two_writers_racing_on_one_key_converge_everywhere() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            nodes = await open_nodes(stack, 4)
            async with trio.open_nursery() as nursery:
                replicas = await start_replicas(nursery, nodes)
                a, b = replicas[0], replicas[3]
                for n in range(20):
                    async with trio.open_nursery() as race:
                        race.start_soon(a.write, {"k": f"a{n}"})
                        race.start_soon(b.write, {"k": f"b{n}"})
                top = max(r.state.version for r in replicas)
                for replica in replicas:
                    assert await replica.wait_for(top, timeout=20)

                def agreed() -> bool:
                    return len({str(snapshot(r)) for r in replicas}) == 1

                await wait_until(agreed, what="the replicas to agree")
                assert snapshot(a)["k"] in {"a19", "b19"}
                nursery.cancel_scope.cancel()

    run(main)


def test_a_malformed_message_is_dropped_and_the_replica_keeps_working() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            nodes = await open_nodes(stack, 2)
            async with trio.open_nursery() as nursery:
                first, second = await start_replicas(nursery, nodes)
                await first.node.publish(config_topic("default"), b'{"op": "update"}')
                await first.write({"ok": 1})
                assert await second.wait_for(1, timeout=20)
                assert second.counters["malformed"] == 1
                assert snapshot(second) == {"ok": 1}
                nursery.cancel_scope.cancel()

    run(main)


WRITER = b"127.0.0.1:1/" + b"0" * 16  # a writer no replica here is


def update_item(writer: bytes, version: int, value: object) -> Delivery:
    """An Update as the replica's subscription hands it over, on the write's own stream."""
    body = encode_update(version, writer, {"k": entry_for(value, version, writer)})
    return Delivery(topic=config_topic("default"), publisher=write_stream(writer, version), seq=0,
                   timestamp_ms=0, key=None, value=body, headers=(), id=bytes(32))  # fmt: skip


def test_a_write_that_overtook_an_earlier_one_waits_for_it_and_wait_for_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replica_module, "GAP_GRACE", 0.5)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            nodes = await open_nodes(stack, 2)
            async with trio.open_nursery() as nursery:
                _, second = await start_replicas(nursery, nodes)
                syncs = second.counters["syncs"]
                second._on_item(update_item(WRITER, 2, "two"))
                assert (second.state.version, second.behind, second.lag()) == (0, True, 2)
                assert snapshot(second) == {}  # version 2's value is not shown without 1's
                assert not await second.wait_for(2, timeout=0.05)
                second._on_item(update_item(WRITER, 1, "one"))  # late, and older
                assert (second.state.version, second.behind) == (2, False)
                assert snapshot(second) == {"k": "two"}
                await trio.sleep(replica_module.GAP_GRACE * 1.5)
                assert second.counters["syncs"] == syncs  # the gap filled itself: no snapshot
                nursery.cancel_scope.cancel()

    run(main)


def test_a_gap_left_open_is_repaired_by_asking_until_a_node_holds_it_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The replica missing version 1..2 asks for snapshots, round after round with a
    growing pause, while nobody holds them; once another replica does, it catches up. It
    says it is behind meanwhile, and logs it once, not per round."""
    monkeypatch.setattr(replica_module, "GAP_GRACE", 0.2)
    monkeypatch.setattr(replica_module, "REPAIR_PAUSE", 0.1)
    caplog.set_level(logging.INFO, logger="episub.config")

    async def main() -> None:
        async with AsyncExitStack() as stack:
            nodes = await open_nodes(stack, 2)
            async with trio.open_nursery() as nursery:
                first, second = await start_replicas(nursery, nodes)
                second.sync_timeout = 0.3  # WRITER, asked first (it wrote 3), never answers
                second._on_item(update_item(WRITER, 3, "three"))
                await wait_until(lambda: second.counters["repairs"] >= 2, what="two rounds")
                assert first.node.id in second.asked
                assert (second.state.version, second.lag(), snapshot(second)) == (0, 3, {})
                for version in (1, 2, 3):
                    first._on_item(update_item(WRITER, version, version))
                assert await second.wait_for(3, timeout=20)
                assert (snapshot(second), second.behind) == ({"k": 3}, False)
                nursery.cancel_scope.cancel()

    run(main)
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "behind: holds version 0 of 3" in m]) == 1, said
    assert len([m for m in said if "caught up at version 3" in m]) == 1, said


def test_each_write_travels_on_a_stream_of_its_own() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            nodes = await open_nodes(stack, 2)
            async with trio.open_nursery() as nursery:
                first, second = await start_replicas(nursery, nodes)
                async with second.node.subscribe(config_topic("default")) as sub:
                    version = await first.write({"a": 1})
                    with trio.fail_after(20):
                        async for item in sub:
                            if isinstance(item, Delivery) and item.publisher != first.node.id:
                                break
                assert (item.publisher, item.seq) == (write_stream(first.node.id, version), 0)
                nursery.cancel_scope.cancel()

    run(main)


def test_wait_for_wakes_each_caller_at_its_version_or_deadline_and_drops_cancelled_ones() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            (node,) = await open_nodes(stack, 1)
            idle = ConfigReplica(node, "other")  # never run: wait_for keeps its own deadline
            assert not await idle.wait_for(1, timeout=0.01)
            async with trio.open_nursery() as nursery:
                (replica,) = await start_replicas(nursery, [node])
                results: dict[str, bool] = {}

                async def wait(name: str, version: int, timeout: float) -> None:
                    results[name] = await replica.wait_for(version, timeout=timeout)

                nursery.start_soon(wait, "one", 1, 60)
                nursery.start_soon(wait, "two", 2, 60)
                nursery.start_soon(wait, "never", 99, 0.05)
                with trio.CancelScope() as cancelled:
                    cancelled.cancel()
                    await replica.wait_for(3, timeout=60)  # cancelled while parked
                await wait_until(lambda: {w[0] for w in replica._waiters} >= {1, 2})
                await replica.write({"k": 1})
                await wait_until(lambda: "one" in results)
                assert "two" not in results
                await replica.write({"k": 2})
                await wait_until(lambda: len(results) == 3)
                assert results == {"one": True, "two": True, "never": False}
                assert replica._waiters == []
                with pytest.raises(ValueError, match="timeout"):
                    await replica.wait_for(5, timeout=-1)
                nursery.cancel_scope.cancel()

    run(main)


def test_a_sync_request_from_a_node_ahead_starts_a_catch_up_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a partition heals, the nodes that had lost a link to the cut-off one ask it
    for a sync, naming their version: that is how it learns of writes nobody will
    announce again. It asks for a snapshot at once, not after GAP_GRACE (made an hour
    here: only the request can have started the catch-up)."""
    monkeypatch.setattr(replica_module, "GAP_GRACE", 3600.0)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            nodes = await open_nodes(stack, 2)
            async with trio.open_nursery() as nursery:
                first, second = await start_replicas(nursery, nodes)
                for version in (1, 2, 3):
                    first._on_item(update_item(WRITER, version, version))
                second._on_item(update_item(WRITER, 1, 1))
                assert (second.state.version, second.behind) == (1, False)
                await first._ask(second.node.id, second.node.address, first.state.version)
                assert await second.wait_for(3, timeout=30)
                assert snapshot(second) == {"k": 3} and first.node.id in second.asked
                nursery.cancel_scope.cancel()

    run(main)
