"""The log allowlist: exactly the fields vkgate's events write, and nothing else gets out."""

from __future__ import annotations

import ast
import json
import logging
from pathlib import Path

from vkgate.logs import FIELDS, JsonFormatter

ROOT = Path(__file__).resolve().parents[1]


def event_fields() -> set[str]:
    """The keyword names of every `event(...)` call in the services and the CLI."""
    names: set[str] = set()
    for package in ("proxy", "controlplane", "vkgate"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "event":
                    names |= {keyword.arg for keyword in node.keywords if keyword.arg}
    return names - {"level"}


def test_the_allowlist_names_exactly_the_fields_events_write() -> None:
    # A field missing here would be dropped silently; one no event writes only widens it.
    assert event_fields() == FIELDS


def test_a_field_off_the_allowlist_is_not_written() -> None:
    record = logging.LogRecord("vkgate.proxy", logging.INFO, "", 0, "request_completed", (), None)
    record.vkgate_fields = {"status": 200, "prompt": "tell me a secret", "key": "vk-abc"}
    line = json.loads(JsonFormatter().format(record))
    assert line["event"] == "request_completed" and line["status"] == 200
    assert "prompt" not in line and "key" not in line
