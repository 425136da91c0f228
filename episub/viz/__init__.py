"""Pictures of an overlay and plots of a simulation run (the `viz` extra).

Nothing under episub imports this package at module level: the `episub` command imports
it only when `--draw` or `--plot` is given, so that a missing extra costs one clear error
line (episub.extras), never an import failure of the command itself.
"""

from __future__ import annotations

from episub.extras import MissingExtra, require

__all__ = ["MissingExtra", "require"]
