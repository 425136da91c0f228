"""The documentation keeps up with the code: the CLI reference names every subcommand and
option, and every page is in the site's navigation (`mkdocs build --strict` in
scripts/test.sh checks links and images)."""

from __future__ import annotations

import argparse
import fnmatch
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
    message, read by a subscriber, then by a listener; then a link change awaited."""
    text = (DOCS / "quickstart.md").read_text()
    subscribe, listen, links = re.findall(r"```python\n(.*?)```", text, re.S)
    outputs = []
    for block in (subscribe, listen, links):
        done = subprocess.run(
            [sys.executable, "-c", block], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.strip())
    assert outputs[0].endswith(" 0 b'hello'"), outputs[0]
    assert outputs[1] == "{b'eur': b'42'}", outputs[1]
    assert outputs[2] == "[]\nTrue", outputs[2]


def test_the_home_page_opens_with_when_to_use_it_install_and_a_first_job() -> None:
    """What a reader sees before the first section heading: what episub is for, how to
    install it, and a first Spark job that writes and reads a topic."""
    first_screen = (DOCS / "index.md").read_text().split("\n## ", 1)[0]
    assert "When to use it" in first_screen
    assert "pip install" in first_screen
    job = re.search(r"```python\n(.*?)```", first_screen, re.S)
    assert job is not None, "no first job before the first section"
    for step in ("spark_connector.register(spark)", 'writeStream.format("episub")',
                 'readStream.format("episub")'):  # fmt: skip
        assert step in job[1], step


def test_the_deployment_guide_covers_standalone_yarn_and_kubernetes_with_commands() -> None:
    text = (DOCS / "deploy.md").read_text()
    sections = dict(re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, re.M | re.S))
    for name in ("Standalone cluster", "YARN", "Kubernetes", "Ports", "What was tried"):
        assert name in sections, f"docs/deploy.md has no section {name!r}"
    for name in ("Standalone cluster", "YARN", "Kubernetes"):
        assert "spark-submit" in sections[name], f"{name}: no spark-submit command"


# What a user page must not carry: our history and one machine's layout. Git keeps history.
_COMMIT_HASH = re.compile(
    r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])"
)
_NOT_HASHES = {"ed25519"}  # words that happen to be lowercase hex
_ISSUE_REFERENCE = re.compile(r"\bissues?\s*#?\d+|(?<![\w&])#\d+\b", re.I)
# Absolute paths of one machine: a checkout, a home directory, a virtualenv outside the
# repository; and the lock our shared development machine serialises heavy runs with.
_MACHINE_PATH = re.compile(
    r"(?<![\w.~$])/(?:work|home|root|Users|mnt|srv|scratch)/[\w.-]+|"
    r"(?<![\w.~$])/[\w./-]*/\.?venv[\w-]*/bin/|"
    r"episub-heavy\.lock"
)


def _user_pages() -> list[Path]:
    return [*sorted(DOCS.glob("*.md")), DOCS.parent / "README.md"]


def _lab_notes(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern in (_COMMIT_HASH, _ISSUE_REFERENCE, _MACHINE_PATH):
            for match in pattern.finditer(line):
                if match.group(0).lower() not in _NOT_HASHES:
                    found.append(f"{number}: {match.group(0)!r}")
    return found


def test_user_docs_carry_no_commit_hash_issue_number_or_machine_path():
    found = {
        page.relative_to(DOCS.parent).as_posix(): notes
        for page in _user_pages()
        if (notes := _lab_notes(page.read_text()))
    }
    assert found == {}


def test_the_lab_notes_check_can_fail():
    """Each pattern finds what it is for, and passes what only looks like it."""
    assert _lab_notes("on commit 5fb317d the figure was") == ["1: '5fb317d'"]
    assert _lab_notes("see issue 13, item 5 and #29") == ["1: 'issue 13'", "1: '#29'"]
    assert _lab_notes("cd /work/main && /home/ana/x/.venv/bin/python") == [
        "1: '/work/main'",
        "1: '/home/ana'",
    ]
    assert _lab_notes("/opt/app/venv/bin/python run.py") == ["1: '/opt/app/venv/bin/'"]
    assert _lab_notes("flock /tmp/episub-heavy.lock pytest") == ["1: 'episub-heavy.lock'"]
    harmless = (
        "Ed25519 keys, 67108864 bytes, --socket /tmp/n0.sock, .venv/bin/episub, "
        "./environment/bin/python, `max_bytes`, deadbeef, 0x1f, [a](#an-anchor)"
    )
    assert _lab_notes(harmless) == []


RESULTS = DOCS.parent / "benchmarks/results"


def _cited_results(pages: dict[str, str], files: list[str]) -> set[str]:
    """Result files (relative to benchmarks/results) the pages cite: by path, by a folder
    or a glob of paths, or, in benchmarks.md's tables, by a name in its sitting/ folder."""
    cited: set[str] = set()
    for name, text in pages.items():
        for match in re.finditer(r"benchmarks/results/([\w./*-]*)", text):
            rel = match.group(1).rstrip(".")
            if rel.endswith("/"):
                cited.update(f for f in files if f.startswith(rel))
            else:
                cited.update(f for f in files if fnmatch.fnmatch(f, rel))
        if name == "benchmarks.md":  # "in benchmarks/results/sitting/ unless another is named"
            for match in re.finditer(r"`([\w./-]+\.(?:json|txt))`", text):
                for rel in (f"sitting/{match.group(1)}", match.group(1)):
                    if rel in files:
                        cited.add(rel)
                        break
    return cited


def test_every_benchmark_result_is_cited_by_a_doc_and_named_without_history():
    files = sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file())
    pages = {
        page.name: page.read_text() for page in [*DOCS.glob("*.md"), DOCS.parent / "README.md"]
    }
    cited = _cited_results(pages, files)  # once: it matches every file against every citation
    assert [f for f in files if f not in cited] == []
    history = re.compile(r"_v\d+\b|_v\d+_|later|[-_][0-9a-f]{7,40}[-_.]")
    assert [f for f in files if history.search(f)] == []


def test_the_result_citation_check_can_fail():
    files = ["sitting/a.json", "b.json", "c95/x.json", "signing_on_1.json", "old.json"]
    pages = {
        "benchmarks.md": "| run | `a.json` |",
        "reliability.md": "JSON: `benchmarks/results/c95/`; `benchmarks/results/b.json`.",
        "other.md": "`benchmarks/results/signing_*.json`, and `a.json` is not sitting's here",
    }
    assert _cited_results(pages, files) == set(files) - {"old.json"}


def test_no_test_puts_benchmarks_on_its_path_or_loads_a_script_from_there():
    uses = re.compile(r"""sys\.path.*benchmarks|["']benchmarks["']|^\s*(from|import) benchmarks""")
    found = [
        f"{path.relative_to(DOCS.parent)}:{n}"
        for path in sorted((DOCS.parent / "tests").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if uses.search(line)
    ]
    assert found == []
