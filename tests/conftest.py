"""Fixtures shared by test modules: `processes` (tests/proc_helpers.py) starts real OS
processes and kills every one of them at teardown."""

from tests.proc_helpers import processes

__all__ = ["processes"]
