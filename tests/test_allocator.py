"""episub/allocator.py: glibc's thresholds fixed, free memory given back, and the rule of
when a node gives it back (quiet, after a large release)."""

from __future__ import annotations

import ctypes.util
import platform

import pytest

from episub.allocator import ReleaseWatch, limit_heap_growth, release_free_memory

glibc = platform.libc_ver()[0] == "glibc" and ctypes.util.find_library("c") is not None


@pytest.mark.skipif(not glibc, reason="glibc's mallopt and malloc_trim")
def test_glibc_takes_the_threshold_and_trims() -> None:
    assert limit_heap_growth() is True
    blocks = [bytearray(1000) for _ in range(20_000)]  # ~20 MB in the heap, then freed
    del blocks
    assert release_free_memory() in (True, False)  # ran (what it found depends on the heap)


class Released:
    def __init__(self) -> None:
        self.bytes = 0

    def __call__(self) -> int:
        return self.bytes


def test_trims_once_quiet_after_a_large_release() -> None:
    released = Released()
    shrunk = []
    watch = ReleaseWatch(released, release_after=100, before_trim=lambda: shrunk.append(1))
    assert not watch.check()  # nothing let go
    released.bytes = 150
    assert not watch.check()  # still letting go (moved since the last look)
    assert watch.check()  # quiet now: trims
    assert watch.trims == 1 and shrunk == [1]
    assert not watch.check()  # nothing new since the trim


def test_a_small_release_or_a_steady_flow_never_trims() -> None:
    released = Released()
    watch = ReleaseWatch(released, release_after=100)
    released.bytes = 99
    assert not watch.check()
    assert not watch.check()  # quiet, but below release_after
    for _ in range(10):  # messages flowing: each look sees more let go
        released.bytes += 1000
        assert not watch.check()
    assert watch.check()
    assert watch.trims == 1


def test_counts_from_where_the_watch_started() -> None:
    released = Released()
    released.bytes = 10_000
    watch = ReleaseWatch(released, release_after=100)
    assert not watch.check()  # what was let go before the watch is not a release now


def test_a_node_counts_what_its_retention_lets_go() -> None:
    """What the node process's ReleaseWatch reads: bytes evicted from retention."""
    from episub import Node
    from episub.proto.store import RetentionConfig
    from tests.net_helpers import KEY, TOPIC, fast_config, run

    async def main() -> None:
        async with Node(
            key=KEY, config=fast_config(), retention=RetentionConfig(max_messages=3)
        ) as n:
            await n.join(TOPIC)
            for i in range(10):
                await n.publish(TOPIC, bytes([i]) * 100)
            assert len(n.retained(TOPIC, n.id, 0, 9)) == 3
            assert n.retention_released == 7 * 100

    run(main)


def test_a_watch_is_pending_only_while_releases_move_or_a_trim_is_due() -> None:
    """The node process looks every second only while pending (runner._watch_releases):
    an idle node must not wake every second for nothing."""
    total = [0]
    watch = ReleaseWatch(lambda: total[0], release_after=100)
    assert not watch.pending()
    total[0] = 40
    assert watch.pending()  # moving
    watch.check()
    assert not watch.pending()  # quiet, and 40 < 100 since the last trim
    total[0] = 140
    watch.check()
    assert watch.pending()  # a trim is due at the next quiet look
    assert watch.check() and not watch.pending()
