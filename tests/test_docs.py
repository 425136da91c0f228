"""The documentation keeps up with the code: the CLI reference names every subcommand and
option, and every page is in the site's navigation (`mkdocs build --strict` in
scripts/test.sh checks links and images)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from episub.cli import build_parser

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    out = {}
    for name, sub in action.choices.items():
        nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        for inner in nested:
            out.update({f"{name} {n}": p for n, p in inner.choices.items()})
        out[name] = sub
    return out


def test_the_cli_reference_names_every_subcommand_and_option():
    text = (DOCS / "cli.md").read_text()
    missing = []
    for name, sub in _subcommands().items():
        if f"episub {name.split()[0]}" not in text:
            missing.append(f"episub {name}")
        for action in sub._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help" and option not in text:
                    missing.append(f"episub {name} {option}")
    assert not missing, f"docs/cli.md lacks: {', '.join(sorted(set(missing)))}"


def test_every_page_is_in_the_navigation():
    nav = (DOCS.parent / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert [p for p in pages if not re.search(rf":\s*{re.escape(p)}\s*$", nav, re.M)] == []


def test_the_quickstart_python_examples_run() -> None:
    """The quickstart's Python blocks, run as they stand: two nodes on loopback, one
    message, read by a subscriber, then by a listener."""
    text = (DOCS / "quickstart.md").read_text()
    subscribe, listen = re.findall(r"```python\n(.*?)```", text, re.S)
    outputs = []
    for block in (subscribe, listen):
        done = subprocess.run(
            [sys.executable, "-c", block], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.strip())
    assert outputs[0].endswith(" 0 b'hello'"), outputs[0]
    assert outputs[1] == "{b'eur': b'42'}", outputs[1]
