"""A real headless browser for the console's tests: Debian's Chromium (``./dev test`` installs it), driven by
Playwright through its own driver. Nothing downloads a browser."""

from __future__ import annotations

import shutil
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import pytest


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("Debian's chromium is not installed (./dev test installs it: apt-get install chromium)")
    return path


class Page:
    """One page and what went wrong in it: uncaught exceptions (a failed request the page shows is not one)."""

    def __init__(self, page) -> None:
        self.page = page
        self.exceptions: list[str] = []
        page.on("pageerror", lambda e: self.exceptions.append(str(e)))

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float, what: str,
                 check: Callable[[], None] | None = None) -> float:
        """Poll ``predicate`` until true; returns the seconds it took. ``check`` raises when a process the wait
        depends on is gone."""
        start = time.monotonic()
        while not predicate():
            if check is not None:
                check()
            if time.monotonic() - start > timeout_s:
                raise AssertionError(f"the console did not show {what} within {timeout_s} s; uncaught exceptions "
                                     f"in the page: {self.exceptions}")
            time.sleep(0.1)
        return time.monotonic() - start


@contextmanager
def browser_page(url: str, **context) -> Iterator[Page]:
    """``url`` open in a fresh headless Chromium (``context``: Playwright's new_context options)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: the suite may run as root, where Chromium's sandbox refuses to start.
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, **context)
            page = Page(ctx.new_page())
            page.page.goto(url)
            yield page
            assert page.exceptions == [], page.exceptions
        finally:
            browser.close()
