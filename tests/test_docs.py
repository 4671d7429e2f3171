"""The docs a newcomer reads: README's first screen, and links that lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def _docs():
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_every_relative_link_in_the_docs_names_a_file_that_exists():
    broken = []
    for doc in _docs():
        for target, _ in LINK.findall(doc.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(REPO)} -> {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_readmes_first_screen_is_for_the_learner():
    """What ppkit is, the two commands, the notebook table and where the docs are come first; no run log."""
    text = (REPO / "README.md").read_text()
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert headings[:3] == ["Start: two commands", "The notebooks", "Where the docs are"], headings
    table = text[text.index("## The notebooks"):text.index("## Where the docs are")]
    for notebook in sorted((REPO / "notebooks").glob("*.ipynb")):
        assert f"`{notebook.stem}`" in table, f"{notebook.name} is missing from README's notebook table"
    assert len(text.splitlines()) < 300, "README is for a first read: details go to docs/"
    assert not re.search(r"\bissues? \d+\b", text.replace("PyTorch issue 74666", "")), "no issue numbers in README"


def test_the_docs_name_no_issue_numbers_of_this_project():
    found = [f"{doc.name}: {m.group(0)}" for doc in _docs()
             for m in re.finditer(r"\b(?<!PyTorch )issues? \d+\b", doc.read_text())]
    assert not found, found
