"""Fixtures shared by test modules.

- `processes` (tests/proc_helpers.py) starts real OS processes and kills every one of
  them at teardown; it then fails the test if any of them logged a core error.
- `no_core_errors` (every test): each node runtime a test creates in this process must
  end with `core_errors == 0`. A core exception is contained (the node carries on), so
  without this check a test could pass over one unseen. A test that injects a fault on
  purpose resets the counter after checking it.

Every JVM the suite starts inherits `JAVA_TOOL_OPTIONS` from here (see below).
"""

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from episub.net.runtime import Runtime
from tests.proc_helpers import processes

__all__ = ["no_core_errors", "processes"]

# No timing thresholds in tests (speed lives in benchmarks): hypothesis's default deadline
# of 200 ms per example fails examples that take 0.2 ms on a quiet machine when six
# engineers share its two cores. A test may still set its own settings.
settings.register_profile("episub", deadline=None)
settings.load_profile("episub")

# Every JVM the suite starts (Spark drivers and executors, standalone masters and workers, the
# Connect server, the examples run as processes) inherits this environment. The suite's JVMs
# live seconds to a minute on two shared cores, where C2's background compiler threads and
# G1's collector threads compete with the work itself and their later gains never come:
# C1 alone and the serial collector ran examples/quickstart.py in 56 s instead of 72-86 s
# (alternating runs, one sitting). Options set by whoever runs the suite are kept.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


@pytest.fixture(autouse=True)
def no_core_errors(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    runtimes: list[Runtime] = []
    original = Runtime.__init__

    def recording_init(self: Runtime, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        runtimes.append(self)

    monkeypatch.setattr(Runtime, "__init__", recording_init)
    yield
    errors = {r.me: r.counters.core_errors for r in runtimes if r.counters.core_errors}
    assert not errors, f"core errors (see the log): {errors}"
