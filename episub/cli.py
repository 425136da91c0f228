"""The `episub` command: one entry point, one subcommand per job.

Each subcommand registers itself with `add_parser(subparsers)` (or `add_parsers`) from its
own package and sets `func`, which returns the exit status. Bad arguments exit with status
2 and one error line, argparse's convention; so does a bad key, config or link-delay file.
Any other failure (an unreachable bootstrap address, an absent agent) is one line on stderr
and status 1. A traceback is printed only with `--debug`.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import NoReturn

from episub import __version__
from episub.agent import cli as agent_cli
from episub.agent.options import UsageError
from episub.sim import cli as sim_cli


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its error as one line (no usage block above it); status 2 still.
    Subcommand parsers are made of the same class (add_subparsers' parser_class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="episub", description="Proximity-aware epidemic pub/sub.")
    parser.add_argument("--version", action="version", version=f"episub {__version__}")
    parser.add_argument("--debug", action="store_true", help="print tracebacks of errors")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    sim_cli.add_parser(subparsers)
    agent_cli.add_parsers(subparsers)
    return parser


def _primary(error: BaseException) -> BaseException:
    """The error to report: trio's nurseries wrap what their tasks raise in groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _describe(error: BaseException) -> str:
    text = str(error)
    if isinstance(error, OSError) and error.strerror and error.filename:
        text = f"{error.strerror}: {error.filename!r}"
    return text or type(error).__name__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    try:
        return args.func(args)
    except BaseException as raised:
        error = _primary(raised)
        if isinstance(error, SystemExit):
            raise error from None
        if isinstance(error, KeyboardInterrupt):
            return 130  # the shell's status for SIGINT
        if isinstance(error, BrokenPipeError):
            # stdout's reader went away (`| head`): nothing left to say, and nothing to
            # flush at exit either (Python's advice for SIGPIPE).
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        if debug:
            traceback.print_exception(raised)
        elif not isinstance(error, Exception):
            raise
        if isinstance(error, UsageError):
            print(f"episub {args.command}: error: {error}", file=sys.stderr)
            return 2
        print(f"episub {args.command}: error: {_describe(error)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
