"""The documentation site, built with --strict and checked in Chromium: every page renders,
nothing overflows at desktop or mobile width, the navigation reaches every page, code blocks
have copy buttons, internal links and anchors resolve, no console errors, nothing is fetched
from outside the site."""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urldefrag, urlsplit

import pytest
import yaml
from playwright.sync_api import Route

from tests.ui.conftest import VIEWPORTS, Tab

ROOT = Path(__file__).resolve().parents[2]


def nav_pages() -> list[str]:
    """The Markdown files in mkdocs.yml's nav, in order."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def walk(items: list) -> Iterator[str]:
        for item in items:
            for value in item.values():
                yield from walk(value) if isinstance(value, list) else [value]

    return list(walk(config["nav"]))


def page_url(base: str, md: str) -> str:
    return base + ("" if md == "index.md" else md.removesuffix(".md") + "/")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(out)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def offline(tab: Tab, base: str) -> list[str]:
    """Abort (and list) every request that leaves the site."""
    outside: list[str] = []

    def handle(route: Route) -> None:
        if route.request.url.startswith(base) or route.request.url.startswith("data:"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    tab.page.route("**/*", handle)
    return outside


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
def test_every_page_renders_without_overflow_or_errors(
    site: str, open_tab: Callable[[str], Tab], viewport: str
) -> None:
    t = open_tab(viewport)
    outside = offline(t, site)
    for md in nav_pages():
        url = page_url(site, md)
        response = t.page.goto(url)
        assert response is not None and response.status == 200, url
        assert t.page.locator("article h1").count() == 1, f"{md}: no title"
        t.page.wait_for_load_state("networkidle")
        assert t.overflow() == 0, f"{md} at {viewport}: overflows by {t.overflow()} px"
        blocks = t.page.locator("article pre > code").count()
        # One copy button per block (Material's class names for it changed across versions).
        copies = (
            t.page.locator("article pre")
            .filter(has=t.page.locator("button[title='Copy to clipboard']"))
            .count()
        )
        assert copies == blocks, f"{md}: {blocks} code blocks, {copies} copy buttons"
        if md == "index.md" or viewport == "desktop":
            t.shot(f"docs-{md.removesuffix('.md')}-{viewport}")
    assert t.errors == [], t.errors
    assert outside == [], f"fetched from outside the site: {outside}"


def test_navigation_reaches_every_page(site: str, open_tab: Callable[[str], Tab]) -> None:
    t = open_tab("desktop")
    t.page.goto(site)
    hrefs = t.page.eval_on_selector_all(
        "nav.md-nav--primary a.md-nav__link[href]", "els => els.map(a => a.href)"
    )
    reached = {urldefrag(h)[0] for h in hrefs}
    missing = [md for md in nav_pages() if page_url(site, md) not in reached]
    assert missing == [], f"not in the navigation: {missing}"
    # And the navigation really navigates: click through to the last page.
    last = nav_pages()[-1]
    t.page.locator("nav.md-nav--primary a.md-nav__link", has_text="Benchmarks").first.click()
    assert t.page.url == page_url(site, last)
    assert t.errors == []


def test_internal_links_and_anchors_resolve(site: str, open_tab: Callable[[str], Tab]) -> None:
    t = open_tab("desktop")
    checked: dict[str, set[str]] = {}  # page url -> ids on it
    broken = []

    def ids_of(url: str) -> set[str] | None:
        if url not in checked:
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    ok = r.status == 200
            except OSError:
                ok = False
            if not ok:
                return None
            t.page.goto(url)
            checked[url] = set(t.page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
        return checked[url]

    for md in nav_pages():
        url = page_url(site, md)
        t.page.goto(url)
        links = t.page.eval_on_selector_all(
            "article a[href]", "els => els.map(a => [a.getAttribute('href'), a.href])"
        )
        for raw, absolute in links:
            if not absolute.startswith(site):
                continue  # external: not fetched offline
            target, fragment = urldefrag(absolute)
            if urlsplit(target).path.endswith((".json", ".png", ".html", ".example")):
                continue
            ids = ids_of(target)
            if ids is None:
                broken.append(f"{md}: {raw} (page not found)")
            elif fragment and fragment not in ids:
                broken.append(f"{md}: {raw} (no #{fragment})")
    assert broken == [], broken
    assert t.errors == [], t.errors
