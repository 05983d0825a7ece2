"""Structured logs for both services: JSON lines (or text) whose fields come from an allowlist.

An event is `event(log, "request_completed", status=200, ...)`: a name and keyword fields; or,
for a line written once a request, `emit(log, line)` with an `Event` struct that names its
fields once. The formatter writes only fields named in `FIELDS`; any other is dropped, so a
careless call cannot put a prompt, a raw key or a provider credential in a log line. End users
are never logged as given: `pseudonym` turns them into an HMAC under `VKGATE_TELEMETRY_KEY`, or
leaves them out.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import select
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from functools import partial
from typing import Any, ClassVar

import msgspec

FLUSH_INTERVAL_S = 0.2
"""The longest an INFO line waits in the buffer (Envoy's access logs wait up to 1 s)."""
FLUSH_BYTES = 64 * 1024
BATCHED_LOGGERS = frozenset({"vkgate.proxy.requests"})
"""The loggers of one line per request, written in batches (`BufferedLines`)."""

# Every structured field any event may carry. Values are ids, counts, codes, durations and
# names from configuration, never request or response content.
FIELDS: frozenset[str] = frozenset(
    {
        # requests
        "route",
        "method",
        "status",
        "code",
        "duration_ms",
        "ttfb_ms",
        "request_id",
        "vk_id",
        "organization_id",
        "model",
        "provider",
        "attempts",
        "end_user_hash",
        "input_tokens",
        "output_tokens",
        "cause",
        "causes",
        "provider_id",
        # guardrails: names from configuration, never what they matched
        "guardrail",
        "stage",
        "on_error",
        # spool and ledger
        "segment",
        "records",
        "bytes",
        "backlog_segments",
        "ingested",
        "duplicates",
        # change feed and configuration
        "revision",
        # admin mutations
        "actor",
        "action",
        "resource_kind",
        "resource_id",
        # process
        "address",
        "reason",
        "grace_s",
        "in_flight",
        "released_polls",
        "pid",
        "exit_code",
        "workers",
        # releases, schema and secrets
        "version",
        "peer_version",
        "kind",
    }
)

_EXTRA = "vkgate_fields"
_LEVELS = {
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warning",
    logging.ERROR: "error",
    logging.CRITICAL: "critical",
}


def event(logger: logging.Logger, name: str, /, level: int = logging.INFO, **fields: Any) -> None:
    """Log the event `name` with `fields` (only those in `FIELDS` are written).

    Where the line's only destination is a `BufferedLines` handler with one of these formatters
    (as `configure` sets up), it is formatted and handed to that handler directly: the same
    line, without a `LogRecord` and the `logging` calls around it (the proxy's line per request
    took 11 % of a governed request's instructions that way, 7 % this way; bench/README.md).
    Anything else on the way (a handler, a filter, a test's capture) gets the record as usual.
    """
    if logger.isEnabledFor(level):
        handler = _sole_handler(logger, level)
        if handler is None or not handler.add_event(level, logger.name, name, fields):
            logger.log(level, name, extra={_EXTRA: fields})


class Event(msgspec.Struct, omit_defaults=True, gc=False):
    """The fields of one kind of event, for `emit`: a subclass names the event (`EVENT`) and
    declares its fields, each in `FIELDS`; a field left None is not written.

    The line is the one `event` writes with the same fields, made with less work: the fields
    are a struct (no dict of keyword arguments, no filtered copy, no line dict to merge them
    into), encoded in one call. `request_completed`, once a request, cost the proxy 54,000
    instructions through `event` and 26,000 this way (bench/README.md).
    """

    EVENT: ClassVar[str]


def emit(logger: logging.Logger, line: Event, /, level: int = logging.INFO) -> None:
    """Log `line`: what `event(logger, line.EVENT, level, **fields)` logs, its None fields
    left out."""
    if logger.isEnabledFor(level):
        handler = _sole_handler(logger, level)
        if handler is None or not handler.add_line(level, logger.name, line):
            logger.log(level, line.EVENT, extra={_EXTRA: _fields(line)})


def _fields(line: Event) -> dict[str, Any]:
    """The line's fields as `event`'s keyword arguments would be: those set, in their order."""
    return {
        name: value for name in line.__struct_fields__ if (value := getattr(line, name)) is not None
    }


_WRITABLE: dict[type[Event], bool] = {}


def _writable(kind: type[Event]) -> bool:
    """Whether every field of `kind` is in `FIELDS` (else its lines take `event`'s way, which
    drops the others)."""
    known = _WRITABLE.get(kind)
    if known is None:
        known = _WRITABLE[kind] = FIELDS.issuperset(kind.__struct_fields__)
    return known


def _sole_handler(logger: logging.Logger, level: int) -> BufferedLines | None:
    """The `BufferedLines` that alone would write `logger`'s record at `level`, unfiltered, with
    a formatter of this module; None when anything else would see it."""
    if logger.disabled:
        return None
    found: BufferedLines | None = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if (
                found is not None
                or type(handler) is not BufferedLines
                or handler.filters
                or level < handler.level
                or type(handler.formatter) not in _EVENT_FORMATTERS
            ):
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    return found


def pseudonym(key: bytes | None, value: str | None) -> str | None:
    """An end user as logs and traces may show it: HMAC-SHA256 under the telemetry key, 16 hex
    characters (enough to group one user's requests, useless to recover the id); None without
    a key, so an unkeyed deployment logs no end user at all."""
    if key is None or not value:
        return None
    return hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:16]


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The allowlisted fields of an event record ({} for a plain message)."""
    raw = getattr(record, _EXTRA, None)
    return _allowed(raw) if raw else {}


_second = -1
_second_text = ""


def _timestamp(created: float) -> str:
    """`created` (unix seconds) as RFC 3339 UTC to the millisecond, as `logging` counts them."""
    global _second, _second_text
    second = int(created)
    if second != _second:  # formatted once a second, not once a line
        _second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second = second
    return f"{_second_text}.{int((created - second) * 1000):03d}Z"


def _allowed(fields: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if name in FIELDS and value is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, event (or message), allowlisted fields."""

    def __init__(self) -> None:
        super().__init__()
        self._encoder = msgspec.json.Encoder()
        self._heads: dict[tuple[int, str, str], str] = {}

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _timestamp(record.created),
            "level": _LEVELS.get(record.levelno, record.levelname.lower()),
            "logger": record.name,
        }
        fields = fields_of(record)
        if hasattr(record, _EXTRA):
            line["event"] = record.msg
            line.update(fields)
        else:
            line["message"] = record.getMessage()
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return self._encoder.encode(line).decode()

    def format_event(
        self, created: float, level: int, logger: str, name: str, fields: dict[str, Any]
    ) -> str:
        """The line `format` makes of the record of `event(logger, name, level, **fields)`."""
        line: dict[str, Any] = {
            "time": _timestamp(created),
            "level": _LEVELS.get(level) or logging.getLevelName(level).lower(),
            "logger": logger,
            "event": name,
        }
        line.update(_allowed(fields))
        return self._encoder.encode(line).decode()

    def format_line(self, created: float, level: int, logger: str, line: Event) -> str:
        """The line `format_event` makes of `line`'s event and fields (all in `FIELDS`)."""
        key = (level, logger, line.EVENT)
        head = self._heads.get(key)
        if head is None:
            # What follows the time, up to the fields: the same for every line of the event.
            head = self._heads[key] = self._encoder.encode(
                {
                    "level": _LEVELS.get(level) or logging.getLevelName(level).lower(),
                    "logger": logger,
                    "event": line.EVENT,
                }
            )[1:-1].decode()
        fields = self._encoder.encode(line)
        rest = "," + fields[1:].decode() if len(fields) > 2 else "}"
        return f'{{"time":"{_timestamp(created)}",{head}{rest}'


def _text(value: object) -> str:
    """A field's value on a text line: strings quoted and escaped (JSON's rules), so a value
    with spaces, quotes or newlines cannot be mistaken for more fields or another line."""
    return _encode(value).decode() if isinstance(value, str) else str(value)


_encode = msgspec.json.Encoder().encode


class TextFormatter(logging.Formatter):
    """`time level logger: event key=value ...`, for a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        if hasattr(record, _EXTRA):
            text = _event_text(record.msg, fields_of(record))
        else:
            # One record, one line: a message cannot forge a line of its own.
            text = record.getMessage().replace("\r", "\\r").replace("\n", "\\n")
        line = f"{_timestamp(record.created)} {record.levelname} {record.name}: {text}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line

    def format_event(
        self, created: float, level: int, logger: str, name: str, fields: dict[str, Any]
    ) -> str:
        """The line `format` makes of the record of `event(logger, name, level, **fields)`."""
        text = _event_text(name, _allowed(fields))
        return f"{_timestamp(created)} {logging.getLevelName(level)} {logger}: {text}"

    def format_line(self, created: float, level: int, logger: str, line: Event) -> str:
        """The line `format_event` makes of `line`'s event and fields."""
        return self.format_event(created, level, logger, line.EVENT, _fields(line))


def _event_text(name: str, fields: dict[str, Any]) -> str:
    pairs = " ".join(f"{field}={_text(value)}" for field, value in fields.items())
    return f"{name} {pairs}".rstrip()


_EVENT_FORMATTERS = (JsonFormatter, TextFormatter)


def skip_unused_record_fields() -> None:
    """Stop working out, for every record, what no vkgate line shows (the logging HOWTO's
    "Optimization"): the caller's file and line, thread, process and multiprocessing names.
    About a third of what a log line costs."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


class BufferedLines(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that batches the one line per request: the `batched` loggers' INFO and
    DEBUG lines wait until `FLUSH_BYTES` are waiting, `interval_s` has passed, or any other
    line is written (which goes at once, after them, so the order holds).

    A `write` per request line was one of the six system calls a served request made (strace:
    five with this handler, bench/README.md). Every other line is written at once, so a
    process killed by a signal (uvicorn ends by raising SIGTERM again, past `atexit`) loses no
    line about its stop; at most `interval_s` of request lines go with a SIGKILL. A batch
    goes out in writes of at most `select.PIPE_BUF` bytes, which a pipe never interleaves with
    another process's: workers sharing one stderr do not tear each other's lines.
    """

    def __init__(
        self, stream: Any, batched: frozenset[str], interval_s: float = FLUSH_INTERVAL_S
    ) -> None:
        super().__init__(stream)
        self._batched = batched
        self._pending: list[str] = []
        self._size = 0
        self._stop = threading.Event()
        self._interval = interval_s
        self._flushing = False
        """The flusher thread runs (in this process: a forked child starts its own)."""
        os.register_at_fork(after_in_child=partial(_forked, weakref.ref(self)))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        # Under the handler's lock (`handle` holds it): the flusher takes it too.
        self._add(line, record.levelno, record.name)

    def add_event(self, level: int, logger: str, name: str, fields: dict[str, Any]) -> bool:
        """Write what `emit` would of `event(logger, name, level, **fields)`'s record, made
        without one (`event` calls this when nothing else would see the record). False when
        the line could not be made: the record then goes the usual way, to `handleError`."""
        formatter = self.formatter
        if not isinstance(formatter, _EVENT_FORMATTERS):
            return False
        try:
            line = formatter.format_event(time.time(), level, logger, name, fields)
        except Exception:
            return False
        with self.lock:  # type: ignore[union-attr]
            self._add(line + self.terminator, level, logger)
        return True

    def add_line(self, level: int, logger: str, line: Event) -> bool:
        """As `add_event`, for `emit`'s struct."""
        formatter = self.formatter
        if not isinstance(formatter, _EVENT_FORMATTERS) or not _writable(type(line)):
            return False
        try:
            text = formatter.format_line(time.time(), level, logger, line)
        except Exception:
            return False
        with self.lock:  # type: ignore[union-attr]
            self._add(text + self.terminator, level, logger)
        return True

    def _add(self, line: str, level: int, logger: str) -> None:
        self._pending.append(line)
        self._size += len(line)
        if level >= logging.WARNING or logger not in self._batched or self._size >= FLUSH_BYTES:
            self.flush()
        elif not self._flushing:
            self._flushing = True
            try:
                threading.Thread(
                    target=self._flush_periodically, name="vkgate-log-flush", daemon=True
                ).start()
            except RuntimeError:  # the interpreter is shutting down: write at once
                self._flushing = False
                self.flush()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            if self._pending:
                lines, self._pending, self._size = self._pending, [], 0
                try:
                    for chunk in _chunks(lines):
                        self.stream.write(chunk)
                        super().flush()
                except Exception:
                    # As `logging` does for a line it cannot write: said on stderr, never raised.
                    with contextlib.suppress(Exception):
                        sys.stderr.write(f"vkgate: {len(lines)} log lines were lost\n")
            else:
                super().flush()

    def _forked(self) -> None:
        # The parent writes what was waiting; this process starts its own flusher.
        self._pending, self._size, self._flushing = [], 0, False

    def close(self) -> None:
        self._stop.set()
        try:
            self.flush()
        finally:
            super().close()

    def _flush_periodically(self) -> None:
        while not self._stop.wait(self._interval):
            if self._pending:
                self.flush()


def _forked(handler: weakref.ref[BufferedLines]) -> None:
    alive = handler()
    if alive is not None:
        alive._forked()


def _chunks(lines: list[str]) -> Iterator[str]:
    """The lines joined into writes of at most `select.PIPE_BUF` bytes (a longer line alone):
    a write that size to a pipe is never interleaved with another process's, so workers
    sharing one stderr cannot tear each other's lines."""
    chunk: list[str] = []
    size = 0
    for line in lines:
        length = len(line.encode())
        if chunk and size + length > select.PIPE_BUF:
            yield "".join(chunk)
            chunk, size = [], 0
        chunk.append(line)
        size += length
    if chunk:
        yield "".join(chunk)


def configure(level: str, log_format: str = "json") -> None:
    """Send every logger's records, uvicorn's included, to stderr in `log_format`."""
    skip_unused_record_fields()
    handler = BufferedLines(sys.stderr, BATCHED_LOGGERS)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    for name in ("uvicorn", "uvicorn.error"):
        server_logger = logging.getLogger(name)
        server_logger.handlers.clear()
        server_logger.propagate = True
    # No access log: the proxy's `request_completed` says more, and says it once. (uvicorn
    # writes access lines whenever this logger has a handler, its parents' included.)
    access = logging.getLogger("uvicorn.access")
    access.handlers.clear()
    access.propagate = False
    # One line per internal call is noise at INFO; failures are logged by vkgate itself.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLevelName(level)))
