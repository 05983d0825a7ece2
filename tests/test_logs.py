"""The log allowlist (exactly the fields vkgate's events write, and nothing else gets out), and
the handler that writes the per-request lines in batches without losing or reordering any."""

from __future__ import annotations

import ast
import io
import json
import logging
import select
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from vkgate.logs import (
    FIELDS,
    FLUSH_BYTES,
    BufferedLines,
    Event,
    JsonFormatter,
    TextFormatter,
    emit,
    event,
)

ROOT = Path(__file__).resolve().parents[1]


def event_fields() -> set[str]:
    """The keyword names of every `event(...)` call in the services and the CLI, and the
    fields of every `Event` struct they declare."""
    names: set[str] = set()
    for package in ("proxy", "controlplane", "vkgate"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "event":
                    names |= {keyword.arg for keyword in node.keywords if keyword.arg}
                if isinstance(node, ast.ClassDef) and any(
                    getattr(base, "id", None) == "Event" for base in node.bases
                ):
                    names |= {
                        field.target.id
                        for field in node.body
                        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                    }
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


class Stream(io.StringIO):
    """What the handler writes to, counting its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.largest = 0
        """The most bytes one write carried."""
        self.written = threading.Event()

    def write(self, text: str) -> int:
        self.writes += 1
        self.largest = max(self.largest, len(text.encode()))
        self.written.set()
        return super().write(text)

    def events(self) -> list[str]:
        return [json.loads(line)["event"] for line in self.getvalue().splitlines()]


@contextmanager
def handled(*names: str, batched: str, interval_s: float = 3600) -> Iterator[Stream]:
    """Loggers `names` at INFO, written by a handler that batches `batched` (an hour between
    timed flushes unless `interval_s` says otherwise)."""
    stream = Stream()
    handler = BufferedLines(stream, frozenset({batched}), interval_s=interval_s)
    handler.setFormatter(JsonFormatter())
    loggers = [logging.getLogger(name) for name in names]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    try:
        yield stream
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
        handler.close()


@pytest.fixture
def lines() -> Iterator[tuple[Stream, logging.Logger, logging.Logger]]:
    """A handler batching `t.requests`, and a logger of each kind writing to it."""
    with handled("t.requests", "t.other", batched="t.requests") as stream:
        yield stream, logging.getLogger("t.requests"), logging.getLogger("t.other")


def test_request_lines_wait_for_the_next_other_line_and_keep_their_order(
    lines: tuple[Stream, logging.Logger, logging.Logger],
) -> None:
    stream, requests, other = lines
    event(requests, "request_completed", status=200)
    event(requests, "request_completed", status=429)
    assert stream.getvalue() == ""
    event(other, "spool_shipped", records=2)
    assert stream.events() == ["request_completed", "request_completed", "spool_shipped"]
    assert stream.writes == 1


def test_a_warning_from_the_batched_logger_goes_out_at_once(
    lines: tuple[Stream, logging.Logger, logging.Logger],
) -> None:
    stream, requests, _ = lines
    event(requests, "request_completed", status=200)
    requests.warning("could not record request r-1")
    assert len(stream.getvalue().splitlines()) == 2


def test_request_lines_go_out_once_enough_bytes_wait(
    lines: tuple[Stream, logging.Logger, logging.Logger],
) -> None:
    stream, requests, _ = lines
    written = 0
    while not stream.getvalue():
        event(requests, "request_completed", request_id="r" * 100)
        written += 1
    assert len(stream.getvalue().splitlines()) == written
    assert len(stream.getvalue()) >= FLUSH_BYTES
    # In pieces a pipe keeps whole, each of whole lines.
    assert stream.writes > 1 and stream.largest <= select.PIPE_BUF


def test_close_writes_what_waits() -> None:
    with handled("t.closing", batched="t.closing") as stream:
        event(logging.getLogger("t.closing"), "request_completed", status=200)
        assert stream.getvalue() == ""
    assert stream.events() == ["request_completed"]


def test_the_timer_writes_request_lines_without_any_other_line() -> None:
    with handled("t.timed", batched="t.timed", interval_s=0.01) as stream:
        event(logging.getLogger("t.timed"), "request_completed", status=200)
        # Nothing else is logged: only the handler's own timer can write the line.
        assert stream.written.wait(10)
        assert stream.events() == ["request_completed"]


class Keep(logging.Filter):
    """Lets every record through: only its presence matters."""

    def filter(self, record: logging.LogRecord) -> bool:
        return True


@pytest.mark.parametrize("formatter", [JsonFormatter, TextFormatter])
def test_an_event_written_without_a_record_is_the_line_the_record_makes(
    formatter: type[JsonFormatter | TextFormatter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`event` formats straight into a handler that alone would write the line; a filter on
    the way makes it go through `logging`. Both write the same line."""
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0429)
    records: list[str] = []
    make_record = logging.Logger.makeRecord

    def counted(self: logging.Logger, *args: Any, **kwargs: Any) -> logging.LogRecord:
        records.append(args[4])  # the message: here, the event's name
        return make_record(self, *args, **kwargs)

    monkeypatch.setattr(logging.Logger, "makeRecord", counted)
    fields = {"status": 200, "code": None, "route": 'chat "x"\nforged=1', "prompt": "secret"}
    written = []
    for filtered in (False, True):
        name = f"t.same.{formatter.__name__}.{filtered}"
        with handled(name, batched=name) as stream:
            logger = logging.getLogger(name)
            for handler in logger.handlers:
                handler.setFormatter(formatter())
            if filtered:
                logger.addFilter(keep := Keep())
            try:
                event(logger, "request_completed", **fields)
                event(logger, "spool_shipped", level=logging.WARNING, records=3)
            finally:
                if filtered:
                    logger.removeFilter(keep)
            written.append(stream.getvalue().replace(name, "t.same"))
    assert records == ["request_completed", "spool_shipped"], "only the filtered ones"
    assert written[0] == written[1]
    assert len(written[0].splitlines()) == 2 and "secret" not in written[0]
    assert "2023-11-14T22:13:20.042Z" in written[0]


class Finished(Event):
    EVENT = "request_completed"

    route: str
    status: int
    code: str | None = None
    attempts: int | None = None


class Careless(Event):
    EVENT = "request_completed"

    status: int
    prompt: str | None = None


@pytest.mark.parametrize("formatter", [JsonFormatter, TextFormatter])
def test_an_event_struct_writes_the_line_its_fields_as_arguments_write(
    formatter: type[JsonFormatter | TextFormatter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`emit(logger, struct)` writes what `event(logger, name, **fields)` does, None fields
    left out, whether it formats straight into the handler or goes through `logging`; a field
    off the allowlist is dropped either way."""
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0429)
    records: list[str] = []
    make_record = logging.Logger.makeRecord

    def counted(self: logging.Logger, *args: Any, **kwargs: Any) -> logging.LogRecord:
        records.append(self.name)
        return make_record(self, *args, **kwargs)

    monkeypatch.setattr(logging.Logger, "makeRecord", counted)
    written = []
    for way in ("event", "emit", "emit filtered"):
        name = f"t.struct.{formatter.__name__}.{way.replace(' ', '_')}"
        with handled(name, batched=name) as stream:
            logger = logging.getLogger(name)
            for handler in logger.handlers:
                handler.setFormatter(formatter())
            if way == "emit filtered":
                logger.addFilter(keep := Keep())
            try:
                if way == "event":
                    event(logger, "request_completed", route='chat "x"\nforged=1', status=200)
                    event(logger, "request_completed", route="r", status=499, attempts=0)
                    event(logger, "request_completed", status=200)
                    event(logger, "request_completed", level=logging.WARNING, status=500)
                else:
                    emit(logger, Finished(route='chat "x"\nforged=1', status=200))
                    emit(logger, Finished(route="r", status=499, code=None, attempts=0))
                    emit(logger, Careless(status=200, prompt="tell me a secret"))
                    emit(logger, Careless(status=500), logging.WARNING)
            finally:
                if way == "emit filtered":
                    logger.removeFilter(keep)
            written.append(stream.getvalue().replace(name, "t.struct"))
    assert written[0] == written[1] == written[2]
    assert len(written[0].splitlines()) == 4 and "secret" not in written[0]
    # Without a filter, only the struct with a field off the allowlist took a record.
    emitted = f"t.struct.{formatter.__name__}.emit"
    assert records.count(emitted) == 2 and records.count(emitted + "_filtered") == 4
    if formatter is JsonFormatter:
        first, second = (json.loads(line) for line in written[0].splitlines()[:2])
        assert list(first) == ["time", "level", "logger", "event", "route", "status"]
        assert first["route"] == 'chat "x"\nforged=1'
        assert second["attempts"] == 0 and "code" not in second


def test_an_event_reaches_every_handler_on_its_way() -> None:
    captured: list[logging.LogRecord] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            captured.append(record)

    with handled("t.parent.child", batched="t.parent.child") as stream:
        child = logging.getLogger("t.parent.child")
        parent = logging.getLogger("t.parent")
        child.propagate = True
        parent.propagate = False
        parent.addHandler(capture := Capture())
        try:
            event(child, "request_completed", status=200)
            parent.disabled = True  # only the child's own flag matters
            child.disabled = True
            event(child, "request_completed", status=201)
        finally:
            parent.removeHandler(capture)
            child.disabled = parent.disabled = False
        handler = child.handlers[0]
        handler.flush()
    assert [r.vkgate_fields["status"] for r in captured] == [200]  # type: ignore[attr-defined]
    assert stream.events() == ["request_completed"]
