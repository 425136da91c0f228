"""Optional dependencies (pyproject's extras): a missing one is one clear error line.

The `episub` command imports pictures (episub/viz, extra `viz`) and the Prometheus endpoint
(episub/metrics.py, extra `metrics`) only when an option asks for them, and checks with
`require` first, before any work is done.
"""

from __future__ import annotations

import importlib

__all__ = ["MissingExtra", "require"]


class MissingExtra(RuntimeError):
    """An optional dependency is not installed; the message names the extra to install."""


def require(extra: str, *modules: str) -> None:
    """Import `modules` or raise MissingExtra naming `pip install 'episub[extra]'`."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingExtra(f"{' and '.join(missing)} not installed: pip install 'episub[{extra}]'")
