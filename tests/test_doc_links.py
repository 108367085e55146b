"""The guides' links lead somewhere: every relative link in README, RECIPES, INSTRUCTORS and HUB
names a file of the repository, and a ``#fragment`` names a heading of its Markdown file (as GitHub
makes them: lower case, punctuation dropped, spaces as hyphens), so that a renamed lesson section
fails here instead of leaving a take-home recipe pointing nowhere."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDES = ["README.md", "RECIPES.md", "INSTRUCTORS.md", "HUB.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)
CODE_BLOCK = re.compile(r"^```.*?^```", re.M | re.S)


def anchor(heading):
    """GitHub's fragment for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    return {anchor(heading) for heading in HEADING.findall(CODE_BLOCK.sub("", path.read_text()))}


@pytest.mark.parametrize("guide", GUIDES)
def test_every_relative_link_names_a_file_and_a_heading(guide):
    source = ROOT / guide
    broken = []
    for target in LINK.findall(CODE_BLOCK.sub("", source.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        file = (source.parent / path).resolve() if path else source
        if not file.exists():
            broken.append(f"{target}: no file {path}")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(f"{target}: no heading #{fragment} in {path or guide}")
    assert not broken, f"{guide}: " + "; ".join(broken)


def test_the_readme_leads_to_the_recipes():
    assert "(RECIPES.md)" in (ROOT / "README.md").read_text()
