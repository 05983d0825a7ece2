"""The control plane's log lines in a test: a JSON handler on its logger, for the test's time."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vkgate.logs import JsonFormatter


class Captured:
    """The JSON lines the control plane's loggers wrote."""

    def __init__(self) -> None:
        self.stream = io.StringIO()

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def events(self, name: str) -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in self.text.splitlines() if line]
        return [line for line in lines if line.get("event") == name]


@contextmanager
def controlplane_logs() -> Iterator[Captured]:
    # A handler on the control plane's logger itself: the app does not configure logging, and
    # what reaches the root logger under pytest depends on pytest's own settings.
    captured = Captured()
    handler = logging.StreamHandler(captured.stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("vkgate.controlplane")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield captured
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
