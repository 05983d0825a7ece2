"""ClickHouse's HTTP interface served by chDB, in a process of its own: the ledger's server path
(clickhouse-connect over HTTP) tested against ClickHouse's own engine where no server runs.

    python -m tests.support.clickhouse_http DIRECTORY    # prints "LISTENING <port>"

It speaks what a ClickHouse server speaks to clickhouse-connect: `GET /ping`; a statement in the
`query` parameter or in the body; `database`; `param_<name>` values for `{name:Type}`
placeholders; every other parameter a setting of that statement alone; after a `query`
parameter, the body as the statement's data (an INSERT's rows, in a text format such as the
ledger's JSON lines: binary ones are not taken), decompressed as its `Content-Encoding` says;
the answer in the statement's FORMAT (TabSeparated by default) with `X-ClickHouse-Format`,
`X-ClickHouse-Summary`, `X-ClickHouse-Timezone` and `X-ClickHouse-Query-Id`; a failure as
status 500 with ClickHouse's own message and `X-ClickHouse-Exception-Code`. Answers are never
compressed, which a server may also choose. Statements run one at a time (chDB is one engine
per process); it stops on SIGTERM.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import lz4.frame

try:
    from compression import zstd  # type: ignore[import-not-found]  # Python 3.14 on
except ImportError:
    from backports import zstd  # clickhouse-connect's own dependency before 3.14

HTTP_ONLY = frozenset(
    {
        "query",
        "database",
        "default_format",
        "query_id",
        "session_id",
        "session_timeout",
        "session_check",
        "compress",
        "decompress",
        "user",
        "password",
        "quota_key",
        "buffer_size",
        "wait_end_of_query",
        "role",
    }
)
"""Parameters the server's HTTP handler takes for itself: not settings of the statement."""
_TRAILING_FORMAT = re.compile(rb"\bFORMAT\s+(\w+)\s*;?\s*$", re.IGNORECASE)
_INSERT = re.compile(rb"^\s*INSERT\b", re.IGNORECASE)
_CODE = re.compile(r"Code: (\d+)")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DECODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.decompress,
    "deflate": zlib.decompress,
    "lz4": lz4.frame.decompress,
    "zstd": zstd.decompress,
}


class Engine:
    """One chDB session on a directory, used by one statement at a time."""

    def __init__(self, directory: Path) -> None:
        from chdb import session

        self._session = session.Session(str(directory))
        self._lock = threading.Lock()

    def run(
        self,
        sql: bytes,
        fmt: str,
        *,
        database: str,
        settings: dict[str, str],
        params: dict[str, str],
    ) -> tuple[bytes, dict[str, str]]:
        """The statement's output (in `fmt` unless it names its own FORMAT) and its summary;
        chDB's own exception, with ClickHouse's message, when it fails."""
        for name in settings:
            if not _NAME.match(name):
                raise RuntimeError(f"Code: 115. DB::Exception: Unknown setting '{name}'")
        if not _NAME.match(database):
            raise RuntimeError(f"Code: 81. DB::Exception: Database {database} does not exist")
        with self._lock:
            self._query(f"USE `{database}`")
            before = self._current(settings)
            try:
                for name, value in settings.items():
                    self._query(f"SET {name} = {_literal(value)}")
                result = self._session.query(sql.decode(), fmt, params=params)
            finally:
                for name, value in before.items():
                    self._query(f"SET {name} = {_literal(value)}")
        count = "written" if _INSERT.match(sql) else "read"
        summary = {
            f"{count}_rows": str(result.rows_read()),
            f"{count}_bytes": str(result.bytes_read()),
        }
        return result.bytes(), summary

    def _current(self, settings: dict[str, str]) -> dict[str, str]:
        if not settings:
            return {}
        names = ", ".join(_literal(name) for name in settings)
        rows = self._query(
            f"SELECT name, value FROM system.settings WHERE name IN ({names})", "JSONCompact"
        )
        return {name: value for name, value in json.loads(rows)["data"]}

    def _query(self, sql: str, fmt: str = "TabSeparated") -> bytes:
        return self._session.query(sql, fmt).bytes()

    def close(self) -> None:
        self._session.close()


def _literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # statements can carry values: nothing is logged

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/ping" or "query=" not in url.query:
                self._answer(200, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"})
            else:
                self._statement(b"")

        def do_POST(self) -> None:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                body = self._chunked()
            else:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
            if encoding and encoding not in _DECODERS:
                self._refuse(f"Code: 1001. DB::Exception: Unknown Content-Encoding '{encoding}'")
                return
            self._statement(_DECODERS[encoding](body) if encoding else body)

        def _chunked(self) -> bytes:
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)

        def _statement(self, body: bytes) -> None:
            given = dict(parse_qsl(urlsplit(self.path).query, keep_blank_values=True))
            query_id = given.get("query_id") or str(uuid.uuid4())
            if "query" in given:
                sql = given["query"].encode() + (b"\n" + body if body else b"")
            else:
                sql = body
            params = {
                k.removeprefix("param_"): v for k, v in given.items() if k.startswith("param_")
            }
            settings = {
                k: v for k, v in given.items() if k not in HTTP_ONLY and not k.startswith("param_")
            }
            fmt = given.get("default_format") or "TabSeparated"
            head = given["query"].encode() if "query" in given else sql
            if not _INSERT.match(head) and (named := _TRAILING_FORMAT.search(head)):
                fmt = named.group(1).decode()
            headers = {"X-ClickHouse-Query-Id": query_id, "X-ClickHouse-Timezone": "UTC"}
            try:
                output, summary = engine.run(
                    sql,
                    fmt,
                    database=given.get("database") or "default",
                    settings=settings,
                    params=params,
                )
            except Exception as exc:  # chDB raises its own message, "Code: N. DB::Exception: ..."
                self._refuse(str(exc).strip(), headers)
                return
            headers["X-ClickHouse-Format"] = fmt
            headers["X-ClickHouse-Summary"] = json.dumps(summary)
            headers["Content-Type"] = "application/octet-stream"
            self._answer(200, output, headers)

        def _refuse(self, message: str, headers: dict[str, str] | None = None) -> None:
            code = _CODE.search(message)
            headers = dict(headers or {})
            headers["X-ClickHouse-Exception-Code"] = code.group(1) if code else "1001"
            headers["Content-Type"] = "text/plain; charset=UTF-8"
            self._answer(500, message.encode() + b"\n", headers)

        def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def serve(directory: Path) -> None:
    engine = Engine(directory)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(engine))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"LISTENING {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        engine.close()


@contextlib.contextmanager
def running(directory: Path, *, timeout_s: float = 60.0) -> Iterator[str]:
    """A server on `directory`, in a process of its own; its base URL (http://127.0.0.1:port)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.clickhouse_http", str(directory)],
        stdout=subprocess.PIPE,
        bufsize=0,  # unbuffered, so that `select` sees every line not read yet
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        yield f"http://127.0.0.1:{_port(process, time.monotonic() + timeout_s)}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _port(process: subprocess.Popen[bytes], deadline: float) -> int:
    """The port the server prints once it listens; anything chDB prints on starting comes first."""
    assert process.stdout is not None
    while True:
        ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise RuntimeError("the chDB ClickHouse server did not start in time")
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the chDB ClickHouse server exited: {process.wait()}")
        if line.startswith(b"LISTENING "):
            return int(line.split()[1])


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
