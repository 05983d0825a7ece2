"""Fixtures of the console's browser tests: one `vkgate up --demo` and one chromium a module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.console.browser import CHROMIUM, Stack, demo_stack, require_chromium


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with demo_stack(tmp_path_factory.mktemp("console") / "home") as running:
        yield running


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()
