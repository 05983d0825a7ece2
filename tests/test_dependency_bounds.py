"""The upper bounds on uvicorn and httptools, whose internals the proxy's HTTP/1.1 protocol and
provider client build on (proxy/http1/, proxy/providers/_connection.py).

A release past a bound must pass these before the bound moves: each failure names what the
release changed, so it shows here rather than as a broken request at run time.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httptools
import pytest
import uvicorn
from packaging.requirements import Requirement
from packaging.version import Version
from uvicorn.protocols.http import flow_control, httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from proxy.http1 import OneWriteHttpToolsProtocol

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL_SOURCE = ROOT / "proxy" / "http1" / "_protocol.py"

# uvicorn's methods the proxy's protocol replaces: uvicorn's server and parser call them by
# these names, so each must still exist there, taking the same arguments.
OVERRIDDEN = (
    "__init__",
    "connection_made",
    "connection_lost",
    "data_received",
    "on_message_begin",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
    "send_400_response",
    "_unsupported_upgrade_warning",
)
# What each request's cycle (proxy/http1/_cycle.py) reads off the connection.
CYCLE_READS = ("transport", "flow", "server_state", "on_response_complete")
# httptools' parser callbacks: those the proxy does not define are uvicorn's.
PARSER_CALLBACKS = (
    "on_message_begin",
    "on_url",
    "on_header",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
)


def bound(package: str) -> Requirement:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (found,) = [Requirement(d) for d in dependencies if Requirement(d).name == package]
    return found


def changed(package: str, what: list[str]) -> str:
    return (
        f"{package} {version(package)} changed what the proxy builds on: {'; '.join(what)}. "
        f"Adapt the proxy to it (proxy/http1/, proxy/providers/_connection.py) before raising "
        f"the bound {bound(package)} in pyproject.toml."
    )


def inherited_attributes() -> set[str]:
    """`self.` names the proxy's protocol reads but neither defines nor assigns: uvicorn's."""
    tree = ast.parse(PROTOCOL_SOURCE.read_text())
    (cls,) = [
        n
        for n in tree.body
        if isinstance(n, ast.ClassDef) and n.name == OneWriteHttpToolsProtocol.__name__
    ]
    own = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    read, assigned = set(), set()
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            (assigned if isinstance(node.ctx, ast.Store) else read).add(node.attr)
    # Assigned by the proxy's protocol too, but made (and first read) by uvicorn's.
    return (read - assigned - own) | {"parser", "cycle", "timeout_keep_alive_task"}


@pytest.fixture
def uvicorn_connection() -> Any:
    """uvicorn's own protocol, as its server makes one for a new connection."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass

    config = uvicorn.Config(app, lifespan="off", log_level="critical", http="httptools")
    config.load()
    loop = asyncio.new_event_loop()
    try:
        yield HttpToolsProtocol(config, ServerState(), {}, _loop=loop)
    finally:
        loop.close()


@pytest.mark.parametrize("package", ["uvicorn", "httptools"])
def test_uvicorn_and_httptools_have_an_upper_bound_the_installed_release_is_within(
    package: str,
) -> None:
    requirement = bound(package)
    uppers = [s for s in requirement.specifier if s.operator in ("<", "<=")]
    assert uppers, f"{package} needs an upper bound in pyproject.toml: the proxy builds on it"
    assert Version(version(package)) in requirement.specifier, (
        f"{package} {version(package)} is installed, outside {requirement}: install from the "
        "locks (make install)"
    )


def test_uvicorn_keeps_the_methods_the_proxy_protocol_replaces() -> None:
    missing = []
    for name in OVERRIDDEN:
        theirs = getattr(HttpToolsProtocol, name, None)
        if theirs is None:
            missing.append(f"HttpToolsProtocol.{name} is gone (the proxy's replaces it)")
            continue
        ours = getattr(OneWriteHttpToolsProtocol, name)
        if name == "__init__":
            continue  # ours passes everything on
        if list(inspect.signature(theirs).parameters) != list(inspect.signature(ours).parameters):
            missing.append(
                f"HttpToolsProtocol.{name} now takes {inspect.signature(theirs)}, the proxy's "
                f"{inspect.signature(ours)}"
            )
    assert not missing, changed("uvicorn", missing)


def test_uvicorn_keeps_the_attributes_the_proxy_protocol_reads(uvicorn_connection: Any) -> None:
    relied_on = inherited_attributes()
    assert {"server_state", "flow", "pipeline", "timeout_keep_alive"} <= relied_on
    # Set per connection: made by connection_made, which needs a transport.
    per_connection = {"transport", "flow", "server", "client", "scheme"}
    missing = sorted(
        f"HttpToolsProtocol has no {name}"
        for name in relied_on - per_connection
        if not hasattr(uvicorn_connection, name)
    )
    assert not missing, changed("uvicorn", missing)


def test_uvicorn_sets_up_each_connection_as_the_proxy_protocol_expects(
    uvicorn_connection: Any,
) -> None:
    class Transport:
        def get_extra_info(self, name: str) -> Any:
            return ("127.0.0.1", 1234) if name in ("peername", "sockname") else None

        def is_closing(self) -> bool:
            return False

        def close(self) -> None:
            pass

    uvicorn_connection.connection_made(Transport())
    missing = [
        f"a connection has no {name} once made"
        for name in (*CYCLE_READS, "server", "client", "scheme")
        if not hasattr(uvicorn_connection, name)
    ]
    flow = uvicorn_connection.flow
    missing += [
        f"its flow control has no {name}"
        for name in ("pause_reading", "resume_reading", "drain", "write_paused", "resume_writing")
        if not hasattr(flow, name)
    ]
    state = uvicorn_connection.server_state
    missing += [
        f"ServerState has no {name}"
        for name in ("default_headers", "total_requests", "connections", "tasks")
        if not hasattr(state, name)
    ]
    status_line = getattr(httptools_impl, "STATUS_LINE", None)
    if not isinstance(status_line, dict) or not isinstance(status_line.get(200), bytes):
        missing.append("httptools_impl.STATUS_LINE no longer maps a status to its line")
    if not isinstance(getattr(flow_control, "HIGH_WATER_LIMIT", None), int):
        missing.append("flow_control.HIGH_WATER_LIMIT is gone")
    assert not missing, changed("uvicorn", missing)


def test_the_parser_callbacks_the_proxy_protocol_leaves_to_uvicorn_exist() -> None:
    missing = [
        f"HttpToolsProtocol.{name} is gone"
        for name in PARSER_CALLBACKS
        if not callable(getattr(OneWriteHttpToolsProtocol, name, None))
    ]
    assert not missing, changed("uvicorn", missing)


class Callbacks:
    """Records the callbacks a parser makes, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("on_"):
            raise AttributeError(name)
        return lambda *args: self.calls.append(name)


def test_httptools_request_parser_calls_back_and_answers_as_the_proxy_reads_it() -> None:
    callbacks = Callbacks()
    parser = httptools.HttpRequestParser(callbacks)
    parser.feed_data(b"POST /v1/x?a=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nhi")
    missing = []
    for name in PARSER_CALLBACKS:
        if name not in callbacks.calls:
            missing.append(f"HttpRequestParser no longer calls {name}")
    answers = {
        "get_method": b"POST",
        "get_http_version": "1.1",
        "should_keep_alive": True,
    }
    for name, expected in answers.items():
        got = getattr(parser, name, lambda: None)()
        if got != expected:
            missing.append(f"HttpRequestParser.{name}() gave {got!r}, not {expected!r}")
    url = httptools.parse_url(b"/v1/x?a=1")
    if (getattr(url, "path", None), getattr(url, "query", None)) != (b"/v1/x", b"a=1"):
        missing.append("parse_url no longer gives .path and .query as bytes")
    try:
        httptools.HttpRequestParser(Callbacks()).feed_data(b"NOT HTTP\r\n\r\n")
        missing.append("HttpRequestParser took a malformed request")
    except httptools.HttpParserError:
        pass
    assert issubclass(httptools.HttpParserUpgrade, Exception), changed(
        "httptools", ["HttpParserUpgrade is gone"]
    )
    assert not missing, changed("httptools", missing)


def test_httptools_response_parser_calls_back_and_answers_as_the_provider_client_reads_it() -> None:
    class Answer(Callbacks):
        keep_alive: object = None

        def on_message_complete(self) -> None:
            # Where the provider client asks it: the parser's state is the answer's here.
            self.calls.append("on_message_complete")
            self.keep_alive = parser.should_keep_alive()

    callbacks = Answer()
    parser = httptools.HttpResponseParser(callbacks)
    parser.feed_data(b"HTTP/1.1 429 Too Many\r\nContent-Length: 2\r\n\r\nno")
    missing = [
        f"HttpResponseParser no longer calls {name}"
        for name in PARSER_CALLBACKS
        if name != "on_url"
        if name not in callbacks.calls
    ]
    if parser.get_status_code() != 429:
        missing.append("HttpResponseParser.get_status_code() no longer gives the status")
    if callbacks.keep_alive is not True:
        missing.append("HttpResponseParser.should_keep_alive() changed")
    assert not missing, changed("httptools", missing)
