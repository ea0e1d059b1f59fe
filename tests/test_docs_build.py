"""The documentation site builds with warnings as errors (a broken link, a page missing
from the navigation, an anchor that does not exist), and works opened from
``site/index.html`` without a server: every navigation link, followed in Chromium from
``file://``, opens its page; every link in a page names a file and an anchor that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.browser import Chromium
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return out


def test_docs_build_strictly(site):
    assert (site / "reference" / "settings.html").exists()


NAV_JS = """() => Array.from(document.querySelectorAll('nav.md-nav--primary a.md-nav__link[href]'))
    .map(a => a.href)"""
# Links of the page's own text (not the theme's), resolved by the browser.
CONTENT_LINKS_JS = """() => Array.from(document.querySelectorAll('article.md-content__inner a[href]'))
    .map(a => a.href)"""


def walk_site(context, index: Path) -> dict:
    """Open *index*, then every navigation link of it, as a reader clicks them."""
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"{page.url}: {e}"))
    page.goto(index.as_uri(), wait_until="load")
    nav = list(dict.fromkeys(u for u in page.evaluate(NAV_JS) if u.startswith("file://")))
    opened = {}
    for url in nav:
        page.goto(url, wait_until="load")
        opened[url] = {
            "title": page.title(),
            "h1": page.locator("article h1").count(),
            "links": page.evaluate(CONTENT_LINKS_JS),
        }
    return {"nav": nav, "opened": opened, "problems": problems}


def anchors(path: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', path.read_text(encoding="utf-8")))


def test_the_site_works_from_file_urls(site):
    chromium = Chromium()
    try:
        walked = chromium.run(walk_site, site / "index.html")
    finally:
        chromium.close()
    pages = sorted(site.rglob("*.md"))  # none: every page is HTML
    assert not pages
    nav = walked["nav"]
    assert len(nav) >= 20, nav
    for url in nav:
        path = Path(unquote(urlsplit(url).path))
        assert path.is_file(), f"a navigation link opens {url}, not a page (a directory?)"
        seen = walked["opened"][url]
        # Chromium titles a directory listing "Index of /...".
        assert seen["h1"] == 1 and not seen["title"].startswith("Index of"), (
            f"{url} is not a page: {seen['title']}"
        )
    assert not walked["problems"], walked["problems"]
    broken = []
    for url, seen in walked["opened"].items():
        for link in seen["links"]:
            parts = urlsplit(link)
            if parts.scheme != "file":
                continue
            target = Path(unquote(parts.path))
            if not target.is_file():
                broken.append(f"{url} -> {link}: no such file")
            elif parts.fragment and unquote(parts.fragment) not in anchors(target):
                broken.append(f"{url} -> {link}: no such anchor")
    assert not broken, "\n".join(broken)
