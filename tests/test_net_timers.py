"""The runtime's timer queue (episub/net/timers.py): when each of the core's timers fires,
one test per rule of its docstring, with `now` stepped by hand (no trio, no clock)."""

from __future__ import annotations

import math

import pytest

from episub.net.timers import SLOW_TICK, SLOW_TICK_AFTER, TIMER_SLACK, TIMER_TICK, TimerQueue

EPOCH = 1_764_000_000.25  # the epoch clock minus trio's: any offset will do
NOW = 1000.0


def queue() -> TimerQueue:
    return TimerQueue(node_id=b"127.0.0.1:7000/abc", epoch=EPOCH)


def on_tick(instant: float, tick: float, phase: float = 0.0) -> bool:
    ticks = (instant - phase) / tick
    return ticks == pytest.approx(round(ticks), abs=1e-6)


def test_a_plain_timer_fires_after_its_delay_and_not_before() -> None:
    timers = queue()
    assert timers.schedule(NOW, 3.3, "exact") == NOW + 3.3
    assert timers.head == NOW + 3.3
    assert timers.pop_due(NOW + 3.2) == []
    assert timers.pop_due(NOW + 3.3) == ["exact"]
    assert len(timers) == 0 and timers.head == math.inf


def test_coalescible_timers_fire_on_whole_ticks_of_the_shared_epoch_clock() -> None:
    timers = queue()
    deadline = timers.schedule(NOW, 3.3, "ping", coalesce=True)
    assert NOW + 3.3 <= deadline < NOW + 3.3 + TIMER_TICK
    assert on_tick(deadline + EPOCH, TIMER_TICK)
    # Another node (another phase) coalesces onto the same instant of the shared clock.
    other = TimerQueue(node_id=b"127.0.0.1:7001/def", epoch=EPOCH)
    assert other.schedule(NOW, 3.3, "ping", coalesce=True) == deadline


def test_upkeep_timers_fire_on_ticks_of_the_nodes_own_phase() -> None:
    timers = queue()
    deadline = timers.schedule(NOW, 3.3, "stabilize", upkeep=True)
    assert NOW + 3.3 <= deadline < NOW + 3.3 + TIMER_TICK
    assert on_tick(deadline, TIMER_TICK, timers.phase)
    other = TimerQueue(node_id=b"127.0.0.1:7001/def", epoch=EPOCH)
    assert other.phase != timers.phase  # nodes' upkeep decisions do not line up


def test_long_upkeep_and_coalescible_timers_share_the_nodes_slow_ticks() -> None:
    timers = queue()
    delay = SLOW_TICK_AFTER + 0.5
    upkeep = timers.schedule(NOW, delay, "optimize", upkeep=True)
    ping = timers.schedule(NOW, delay + 1.0, "ping", coalesce=True)
    for deadline in (upkeep, ping):
        assert on_tick(deadline, SLOW_TICK, timers.phase)
    assert upkeep == ping  # one wakeup for both
    assert timers.upkeep_deadline(NOW, delay) == upkeep  # the process's own upkeep too


def test_timers_due_within_the_slack_fire_in_one_wakeup_in_deadline_order() -> None:
    timers = queue()
    timers.schedule(NOW, 2.0 + TIMER_SLACK / 2, "second")
    timers.schedule(NOW, 2.0, "first")
    timers.schedule(NOW, 2.0 + 10 * TIMER_SLACK, "later")
    assert timers.pop_due(NOW + 2.0) == ["first", "second"]
    assert timers.tokens() == ["later"]


def test_a_timer_may_fire_early_only_inside_its_window_and_then_is_gone() -> None:
    timers = queue()
    timers.schedule(NOW, 0.2, "ihave", early=0.15)
    timers.schedule(NOW, 0.3, "plain")
    assert not timers.take_early(NOW + 0.01)  # before its window
    assert list(timers.take_early(NOW + 0.06)) == ["ihave"]
    assert timers.tokens() == ["plain"] and timers.head == NOW + 0.3
    assert not timers.take_early(NOW + 0.25)  # taken once
    assert timers.pop_due(NOW + 0.3) == ["plain"]


def test_an_early_timer_that_came_due_fires_once_on_time() -> None:
    timers = queue()
    timers.schedule(NOW, 0.2, "ihave", early=0.05)
    assert timers.pop_due(NOW + 0.2) == ["ihave"]
    assert not timers.take_early(NOW + 0.2)  # not fired a second time
