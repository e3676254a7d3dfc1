"""The docs hold together: every link to a page or an anchor of the repository lands, and every error code is
documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def prose(page: Path) -> str:
    """The page without its code blocks (a link in an example is not the page's)."""
    return FENCE.sub("", page.read_text())


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings (lower case, punctuation dropped, spaces to hyphens, repeats
    numbered), and any explicit ``id``."""
    seen: dict[str, int] = {}
    out = set(re.findall(r"""<(?:a|span)\s+(?:name|id)=["']([^"']+)["']""", page.read_text()))
    for line in prose(page).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        text = re.sub(r"`|\*\*|\*|_(?=\w)|(?<=\w)_|\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def targets() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        text = prose(page)
        for target in LINK.findall(text) + IMAGE.findall(text):
            if not re.match(r"^[a-z]+:", target):  # http:, https:, mailto: are not the repository's
                out.append((str(page.relative_to(REPO)), target))
    return out


@pytest.mark.parametrize("page, target", targets())
def test_every_link_of_the_docs_lands_on_a_file_and_its_anchor(page, target):
    path, _, anchor = target.partition("#")
    source = REPO / page
    landing = (source.parent / path).resolve() if path else source
    assert landing.exists(), f"{page}: {target} — no such file {landing.relative_to(REPO) if landing.is_relative_to(REPO) else landing}"
    if anchor and landing.suffix == ".md":
        assert anchor in anchors(landing), f"{page}: {target} — no heading #{anchor} in {landing.name}"


def test_every_error_code_is_documented():
    codes = {c for package in ("freshroute", "router", "store_node", "pipeline", "tools")
             for f in (REPO / package).rglob("*.py") for c in re.findall(r'^\s+code = "([A-Z_]+)"', f.read_text(), re.M)}
    text = "".join(p.read_text() for p in PAGES)
    assert len(codes) > 10
    missing = {c for c in codes if f"`{c}`" not in text}
    assert not missing, f"error codes in no page (as `CODE`): {sorted(missing)}"


def test_every_repository_path_the_docs_name_exists():
    tops = [d.name for d in REPO.iterdir() if d.is_dir() and not d.name.startswith(".") and d.name != "build"]
    path = re.compile(r"`((?:%s)/[\w./-]+?)(?:::\w+)?`" % "|".join(map(re.escape, tops)))
    missing = []
    for page in PAGES:
        for m in path.finditer(page.read_text()):
            named = m.group(1).rstrip("/.")
            if not any(ch in named for ch in "*{<") and not (REPO / named).exists():
                missing.append(f"{page.relative_to(REPO)}: {named}")
    assert not missing


def test_the_architecture_names_every_module_of_the_library_and_the_roles():
    # A newcomer reads the layout to find a module's room: each module has its line there (generated code aside).
    doc = (REPO / "docs" / "architecture.md").read_text()
    layout = doc[doc.index("## Layout"):doc.index("A REST point lookup")]
    unnamed = sorted(str(p.relative_to(REPO)) for room in ("freshroute", "pipeline", "store_node", "router")
                     for p in (REPO / room).rglob("*.py")
                     if p.name not in ("__init__.py", "__main__.py") and "_pb2" not in p.name and p.name not in layout)
    assert unnamed == []
