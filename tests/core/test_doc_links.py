"""Every relative link in README.md, docs/, the experiments' reports and benchmarks/README.md
points at a file or folder of the repository, and every link to a heading (``#anchor``,
GitHub's slug) at a heading of the page it names. The README stays a five-minute read, and every
docs page can be reached from it."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("**/*.md")),
    ROOT / "experiments" / "README.md",
    *sorted((ROOT / "experiments").glob("*/*.md")),
    ROOT / "benchmarks" / "README.md",
]


def _text(page: Path) -> str:
    return re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # not inside code blocks


def relative_links(page: Path) -> list[str]:
    """The page's links that are neither URLs nor anchors of the page itself."""
    out = []
    for target in LINK.findall(_text(page)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#{1,6}\s+(.*)$", _text(page), flags=re.M)}


def test_slugs_as_github_makes_them():
    assert (
        slug("Training at scale: pre-tokenized shards") == "training-at-scale-pre-tokenized-shards"
    )
    assert slug("The window-size study (the paper's finding at CPU scale)") == (
        "the-window-size-study-the-papers-finding-at-cpu-scale"
    )


def test_the_link_pattern_finds_links():
    page = "see [the notes](experiments/NOTES.md#x), [web](https://a.b) and ![img](p.png)"
    assert LINK.findall(page) == ["experiments/NOTES.md#x", "https://a.b"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    missing = [t for t in relative_links(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)}: links to missing {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_heading_links_resolve(page):
    own = anchors(page)
    bad = []
    for target in LINK.findall(_text(page)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or "#" not in target:
            continue
        path, anchor = target.split("#", 1)
        other = (page.parent / path) if path else page
        if (
            other.suffix == ".md"
            and other.is_file()
            and anchor not in (own if not path else anchors(other))
        ):
            bad.append(target)
    assert not bad, f"{page.relative_to(ROOT)}: links to missing headings {bad}"


README_MAX_LINES = 250


def test_the_readme_is_short():
    # the detail lives in docs/; the README keeps the set-up commands, a short tour and links
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES})"


def test_the_readme_starts_with_the_two_setup_commands():
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```bash", 1)[1].split("```", 1)[0]
    assert [ln.split()[:2] for ln in first_block.strip().splitlines()] == [
        ["make", "demo"],
        ["make", "test"],
    ]
    assert text.index("```bash") < text.index("\n## ")  # before the first section


def test_every_docs_page_is_linked_from_the_readme_or_the_docs_index():
    linked = {
        (page.parent / target).resolve()
        for page in (ROOT / "README.md", ROOT / "docs" / "README.md")
        for target in relative_links(page)
    }
    pages = sorted((ROOT / "docs").glob("**/*.md"))
    assert ROOT / "docs" / "README.md" in pages
    orphans = [str(p.relative_to(ROOT)) for p in pages if p.name != "README.md" and p not in linked]
    assert not orphans, f"docs pages linked from neither README.md nor docs/README.md: {orphans}"
    assert (ROOT / "docs" / "README.md").resolve() in linked
