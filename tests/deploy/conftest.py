"""The chart, loaded once: Helm's engine renders it in milliseconds, offline."""

from __future__ import annotations

from collections.abc import Iterator

import helm_python as helm
import pytest

from tests.deploy.chart import load


@pytest.fixture(scope="session")
def chart() -> Iterator[helm.Chart]:
    with load() as loaded:
        yield loaded
