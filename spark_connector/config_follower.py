"""A process's own copy of one configuration, kept current by a thread that follows its agent.

`config.get` is meant to be called per row inside a UDF, as a broadcast variable's `.value`
is. Asking the agent each time costs a round trip over its Unix socket (about 0.1 ms of the
task's time per row, measured: docs/config.md), so each Python process keeps a copy and
a daemon thread keeps it current with a long poll: the agent answers the poll as soon as
its replica passes the copy's version, so the copy trails the replica by one local round
trip, and a read costs an attribute lookup.

Rules:
- The copy serves reads only while its thread is attached to the agent (a poll
  outstanding on a live connection). When the agent goes away the copy is dropped from
  service at once and callers read the agent themselves, which fails with the usual clear
  error if there is no agent; the thread reattaches every `REATTACH_WAIT` seconds.
- The copy never goes backwards: a view is taken only if its version is higher, whoever
  brings it (the thread, a caller's own read, the driver's own write).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from episub.agent import AgentUnavailable, AgentWaitExpired, ConfigView

__all__ = ["REATTACH_WAIT", "WATCH_POLL", "Follower"]

log = logging.getLogger("spark_connector.config")

WATCH_POLL = 30.0  # s a long poll waits before asking again; guess, any value works
REATTACH_WAIT = 1.0  # s between attempts to reach an agent that went away; guess


class Follower:
    """This process's copy of configuration `name`, read through `client_factory`'s agent."""

    def __init__(self, name: str, client_factory: Callable[[], AbstractContextManager[Any]]):
        self.name = name
        self._client_factory = client_factory
        self._view: ConfigView | None = None
        self._attached = False  # a poll is outstanding on a live connection to the agent
        self._lock = threading.Lock()
        self._moved = threading.Condition(self._lock)  # the copy advanced or stepped aside
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self) -> ConfigView | None:
        """The copy, if it is being kept current; None: read the agent instead."""
        return self._view if self._attached else None

    def offer(self, view: ConfigView) -> ConfigView:
        """Take `view` if it is newer than the copy; returns the copy (the newer of the two).
        Starts the thread on first use."""
        with self._lock:
            if self._view is None or view.version > self._view.version:
                self._view = view
                self._moved.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"episub-config-{self.name}", daemon=True
                )
                self._thread.start()
            return self._view

    def wait_for(self, version: int, timeout: float, attach_grace: float = 0.0) -> bool | None:
        """Wait until the copy reaches `version`: True, or False after `timeout` s; None
        when the copy is not being kept current (ask the agent), at once or after waiting
        up to `attach_grace` s for its thread to attach."""
        now = time.monotonic()
        deadline, attach_by = now + timeout, now + min(attach_grace, timeout)
        with self._moved:
            while True:
                if not self._attached:
                    if time.monotonic() >= attach_by:
                        return None
                    self._moved.wait(attach_by - time.monotonic())
                    continue
                if self._view is not None and self._view.version >= version:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._moved.wait(remaining)

    def _detach(self) -> None:
        with self._moved:
            self._attached = False
            self._moved.notify_all()

    def stop(self) -> None:
        """Stop serving and end the thread after its current poll (tests; a daemon anyway)."""
        self._stopped.set()
        self._detach()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                with self._client_factory() as client:
                    while not self._stopped.is_set():
                        view = self._view
                        with self._moved:
                            self._attached = True
                            self._moved.notify_all()
                        try:
                            newer = client.config_read(
                                self.name, (view.version if view else 0) + 1, WATCH_POLL
                            )
                        except AgentWaitExpired:
                            continue  # nothing new within the poll: ask again
                        self.offer(newer)
            except AgentUnavailable as exc:
                log.info("config %r: the agent went away (%s); reading it directly", self.name,
                         exc)  # fmt: skip
            except Exception:
                log.exception("config %r: following the agent failed", self.name)
            self._detach()
            self._stopped.wait(REATTACH_WAIT)
