"""Pictures of an overlay and plots of a simulation run (the `viz` extra).

Nothing under episub imports this package at module level: the `episub` command imports
it only when `--draw` or `--plot` is given, so that a missing extra costs one clear error
line, never an import failure of the command itself.
"""

from __future__ import annotations

__all__ = ["MissingExtra", "require"]


class MissingExtra(RuntimeError):
    """An optional dependency is not installed; the message names the extra to install."""


def require(extra: str, *modules: str) -> None:
    """Import `modules` or raise MissingExtra naming `pip install 'episub[extra]'`."""
    import importlib

    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingExtra(f"{' and '.join(missing)} not installed: pip install 'episub[{extra}]'")
