"""Fixtures shared by test modules.

- `processes` (tests/proc_helpers.py) starts real OS processes and kills every one of
  them at teardown; it then fails the test if any of them logged a core error.
- `no_core_errors` (every test): each node runtime a test creates in this process must
  end with `core_errors == 0`. A core exception is contained (the node carries on), so
  without this check a test could pass over one unseen. A test that injects a fault on
  purpose resets the counter after checking it.
"""

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
