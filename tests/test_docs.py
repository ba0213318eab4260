"""The documentation: docs/ builds as a site under `mkdocs build --strict` (broken links, missing
anchors and pages left out of the nav are errors there), every page is reachable by links from
the index, and README's links lead to pages and anchors that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# A Markdown link or image: [text](target) or ![alt](target); the target has no spaces.
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")


def links(path: Path) -> list[str]:
    """The link targets of a Markdown file, outside code blocks and code spans."""
    text = _CODE.sub("", _FENCE.sub("", path.read_text(encoding="utf-8")))
    return _LINK.findall(text)


def local_target(source: Path, target: str) -> tuple[Path, str] | None:
    """(file, anchor) of a relative link from `source`, or None for a URL or a page anchor."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
        return None
    file, _, anchor = target.partition("#")
    return (source.parent / file).resolve(), anchor


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def html_of(site: Path, page: Path) -> str:
    """The built HTML of a docs page (mkdocs' directory URLs: x.md -> x/index.html)."""
    relative = page.relative_to(DOCS).with_suffix("")
    built = site / "index.html" if relative.name == "index" else site / relative / "index.html"
    return built.read_text(encoding="utf-8")


def test_strict_build_passes(site):
    assert (site / "index.html").is_file()


def test_every_page_is_reachable_from_the_index():
    pages = set(DOCS.rglob("*.md"))
    seen, todo = set(), [DOCS / "index.md"]
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        for target in links(page):
            found = local_target(page, target)
            if found and found[0].suffix == ".md" and found[0] in pages:
                todo.append(found[0])
    unreachable = sorted(str(p.relative_to(DOCS)) for p in pages - seen)
    assert not unreachable, f"pages no link from docs/index.md leads to: {unreachable}"


def test_readme_links_lead_to_files_and_anchors(site):
    readme = ROOT / "README.md"
    targets = [local_target(readme, t) for t in links(readme)]
    local = [t for t in targets if t is not None]
    assert any(file == DOCS / "index.md" for file, _ in local), "README links the docs index"
    for file, anchor in local:
        assert file.exists(), f"README links {file.relative_to(ROOT)}, which does not exist"
        if anchor:
            assert file.is_relative_to(DOCS) and file.suffix == ".md", (file, anchor)
            assert f'id="{anchor}"' in html_of(site, file), f"no #{anchor} in {file.name}"
