"""The README is a front door that stays true: its job table is the jobs that exist (from their
docstrings), every page it links exists, and it stays short (the method lives in docs/)."""

from __future__ import annotations

import re

from helpers.configs import REPO
from vlaeval.help import job_summaries

README = (REPO / "README.md").read_text()
START, END = "<!-- jobs:start", "<!-- jobs:end -->"


def job_table() -> str:
    rows = [f"| `job={name}` | {summary} |" for name, summary in job_summaries().items()]
    return "\n".join(["| job | what it answers |", "|---|---|", *rows])


def test_the_job_table_is_every_job_there_is():
    block = README[README.index(START) : README.index(END)]
    table = block.split("\n", 1)[1].strip()
    assert table == job_table(), "regenerate the README's job table from:\n" + job_table()


def test_every_job_has_an_example():
    for name in job_summaries():
        assert re.search(rf"vlaeval job={name}\b", README), f"the README shows no example of job={name}"


def test_every_linked_page_exists():
    pages = re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)\)", README)
    assert pages
    missing = [page for page in pages if not (REPO / page).exists()]
    assert missing == []
    for page in (REPO / "docs").glob("*.md"):
        for link in re.findall(r"\]\(([\w./-]+\.md)\)", page.read_text()):
            assert (page.parent / link).resolve().exists(), f"{page.name} links {link}, which does not exist"


def test_the_readme_stays_a_front_door():
    assert len(README.splitlines()) <= 320
