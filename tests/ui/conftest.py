"""The browser tier (make test-ui): Debian's chromium driven by Playwright for Python.

Playwright's own browser download cannot work here, so the system chromium is launched by
path (SKILLSTATE_CHROMIUM overrides /usr/bin/chromium)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright import sync_api as playwright_sync

CHROMIUM = os.environ.get("SKILLSTATE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORTS = {"desktop": (1280, 800), "mobile": (390, 844)}


@pytest.fixture(scope="session")
def browser() -> Iterator[playwright_sync.Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: apt-get install chromium (or set SKILLSTATE_CHROMIUM)")
    with playwright_sync.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@dataclass
class Tab:
    """A page that records console errors and uncaught exceptions."""

    page: playwright_sync.Page
    shots: Callable[[str], list[Path]]
    errors: list[str] = field(default_factory=list)

    def overflow(self) -> int:
        """How many CSS pixels the document is wider than the viewport (0 = none)."""
        return int(
            self.page.evaluate(
                "() => Math.max(document.documentElement.scrollWidth,"
                " document.body.scrollWidth) - document.documentElement.clientWidth"
            )
        )

    def shot(self, name: str) -> None:
        for path in self.shots(name):
            self.page.screenshot(path=str(path), full_page=True)


@pytest.fixture
def shot_paths(tmp_path: Path) -> Callable[[str], list[Path]]:
    """Screenshot destinations: the test's tmp dir, and SKILLSTATE_UI_SHOTS when set."""
    extra = os.environ.get("SKILLSTATE_UI_SHOTS")

    def paths(name: str) -> list[Path]:
        out = [tmp_path / "shots" / f"{name}.png"]
        if extra:
            out.append(Path(extra) / f"{name}.png")
        for p in out:
            p.parent.mkdir(parents=True, exist_ok=True)
        return out

    return paths


@pytest.fixture
def open_tab(
    browser: playwright_sync.Browser, shot_paths: Callable[[str], list[Path]]
) -> Iterator[Callable[[str], Tab]]:
    """open_tab("desktop" | "mobile") -> a Tab in a fresh context of that viewport."""
    contexts = []

    def open_(viewport: str) -> Tab:
        w, h = VIEWPORTS[viewport]
        ctx = browser.new_context(viewport={"width": w, "height": h})
        contexts.append(ctx)
        page = ctx.new_page()
        tab = Tab(page, shot_paths)
        page.on("console", lambda m: m.type in ("error", "assert") and tab.errors.append(m.text))
        page.on("pageerror", lambda e: tab.errors.append(f"uncaught: {e}"))
        return tab

    yield open_
    for ctx in contexts:
        ctx.close()
