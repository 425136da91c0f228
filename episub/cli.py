"""The `episub` command: one entry point, one subcommand per job.

Each subcommand registers itself with `add_parser(subparsers)` from its own package and
sets `func`, which returns the exit status. Bad arguments exit with status 2 and one
error line, argparse's convention.
"""

from __future__ import annotations

import argparse
import sys

from episub import __version__
from episub.sim import cli as sim_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="episub", description="Proximity-aware epidemic pub/sub.")
    parser.add_argument("--version", action="version", version=f"episub {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    sim_cli.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
