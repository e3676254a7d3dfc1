"""A real headless browser for the console's tests: Debian's Chromium (``./dev test`` installs it), driven by
Playwright through its own driver. Nothing downloads a browser."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from typing import Callable, Iterator

import pytest

from tests.integration.stack_fixture import wait_until


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
                 check: Callable[[], None] | None = None) -> None:
        """:func:`wait_until` ``predicate``, saying on timeout what the page raised meanwhile."""
        try:
            wait_until(predicate, timeout_s, f"the console to show {what}", interval_s=0.1, check=check)
        except AssertionError as e:
            raise AssertionError(f"{e}; uncaught exceptions in the page: {self.exceptions}") from None


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
