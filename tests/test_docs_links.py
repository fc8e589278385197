"""The README and docs/ link to each other's sections and to files in the repository: every such
link must land. A README edit once dropped the "Production" heading with its first lines, and
only a reader following `[Production](#production)` would have noticed."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from tests.helpers import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "sandbox" / "README.md"]
# [text](target): the target up to the closing bracket; external addresses are not checked.
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks (a "# comment" in a shell block is no heading)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


@cache  # a file is read once, however many links point into it
def anchors(path: Path) -> frozenset[str]:
    """The anchors GitHub gives the headings of a Markdown file: lower case, punctuation other
    than hyphens and underscores dropped, spaces made hyphens, repeats numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text()):
        heading = re.match(r"#{1,6} (.+)", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(out)


def links(path: Path) -> list[str]:
    return [
        target
        for line in _prose(path.read_text())
        for target in LINK.findall(line)
        if not re.match(r"[a-z]+:", target)  # http:, https:, mailto:
    ]


def test_anchors_follow_githubs_rules() -> None:
    page = ROOT / "docs" / "performance.md"
    found = anchors(page)
    # Headings this repository links to, as GitHub spells them.
    assert "bench_approve-an-approvers-click-to-the-calls-dispatch" in found
    assert "the-approve-click" in found
    assert not any(" " in a or "`" in a for a in found)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_lands(doc: Path) -> None:
    broken = []
    for target in links(doc):
        file_part, _, anchor = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert broken == [], "\n".join(broken)
