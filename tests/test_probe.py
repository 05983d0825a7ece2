"""vkgate/probe.py: real failures on loopback, each named by its cause, with a fix and no secret."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from vkgate.probe import FIXES, Failure, classify, error_message, from_status

HEALTH = "/api/internal/gateway/health"


def failure_of(url: str, *, timeout: float = 5.0) -> Failure:
    """What classify makes of the exception a real GET of `url` raises."""
    with pytest.raises(httpx.HTTPError) as raised:
        httpx.get(url, timeout=timeout)
    return classify(raised.value)


def closed_port() -> int:
    """A loopback port nothing listens on: bound once, then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class _Answer(BaseHTTPRequestHandler):
    """Answers every GET as the server's `answer` says: (status, JSON body)."""

    def do_GET(self) -> None:
        status, body = self.server.answer  # type: ignore[attr-defined]
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: object) -> None:
        pass  # TLS bytes sent to this plain server would fill the test's output


@pytest.fixture
def http_server() -> Iterator[ThreadingHTTPServer]:
    """A plain-HTTP server on loopback; set its `answer` before calling it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    server.answer = (200, {"status": "ok"})  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _port(server: ThreadingHTTPServer) -> int:
    return server.server_address[1]


def test_an_unresolvable_host_name_is_dns() -> None:
    # .invalid never resolves (RFC 6761), and fails without asking any DNS server.
    failure = failure_of("http://controlplane.invalid:5560/healthz")
    assert failure.cause == "dns"
    assert "'controlplane.invalid'" in failure.detail
    assert failure.fix == FIXES["dns"]
    assert "VKGATE_CONTROLPLANE_URL" in failure.fix


def test_a_closed_port_is_connect() -> None:
    port = closed_port()
    failure = failure_of(f"http://127.0.0.1:{port}/healthz")
    assert failure.cause == "connect"
    assert f"127.0.0.1:{port}" in failure.detail
    assert "connection refused" in failure.detail
    assert "vkgate controlplane" in failure.fix


def test_https_to_a_plain_http_server_is_tls(http_server: ThreadingHTTPServer) -> None:
    failure = failure_of(f"https://127.0.0.1:{_port(http_server)}/healthz")
    assert failure.cause == "tls"
    assert "TLS handshake" in failure.detail
    assert "http://" in failure.fix and "certificate" in failure.fix


def test_a_server_that_accepts_and_never_answers_is_timeout() -> None:
    # The kernel completes the handshake for a listening socket: the request is sent, and no
    # answer ever comes, since nothing calls accept().
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        failure = failure_of(f"http://127.0.0.1:{port}/healthz", timeout=0.2)
    assert failure.cause == "timeout"
    assert f"127.0.0.1:{port} accepted the request but sent no answer" in failure.detail


def test_a_server_that_does_not_speak_http_is_protocol() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]

        def babble() -> None:
            connection, _ = server.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")

        thread = threading.Thread(target=babble, daemon=True)
        thread.start()
        failure = failure_of(f"http://127.0.0.1:{port}/healthz")
        thread.join(timeout=5)
    assert failure.cause == "protocol"
    assert "did not answer as an HTTP server should" in failure.detail


def test_a_refused_signature_is_signature_and_names_the_secret_and_the_clocks(
    http_server: ThreadingHTTPServer,
) -> None:
    http_server.answer = (  # type: ignore[attr-defined]
        401,
        {
            "error": {
                "message": "internal API signature refused: mismatch",
                "type": "authentication_error",
                "code": "bad_signature",
                "param": None,
            }
        },
    )
    response = httpx.get(f"http://127.0.0.1:{_port(http_server)}{HEALTH}")
    assert response.status_code == 401

    failure = from_status(response.status_code, error_message(response.content))

    assert failure.cause == "signature"
    assert "signature refused: mismatch" in failure.detail
    assert failure.detail.index("VKGATE_INTERNAL_SECRET") < failure.detail.index("300 s")
    assert "VKGATE_INTERNAL_SECRET" in failure.fix and "clock" in failure.fix


def test_a_signature_refused_for_skew_names_the_clocks_first() -> None:
    failure = from_status(401, "internal API signature refused: skew")
    assert failure.cause == "signature"
    assert failure.detail.index("300 s") < failure.detail.index("VKGATE_INTERNAL_SECRET")


def test_another_status_is_http_and_keeps_the_message(http_server: ThreadingHTTPServer) -> None:
    http_server.answer = (  # type: ignore[attr-defined]
        503,
        {"error": {"message": "database unreachable", "type": "api_error", "code": "x"}},
    )
    response = httpx.get(f"http://127.0.0.1:{_port(http_server)}{HEALTH}")

    failure = from_status(response.status_code, error_message(response.content))

    assert failure == Failure("http", "the control plane answered HTTP 503 (database unreachable)")
    assert str(failure) == "http: the control plane answered HTTP 503 (database unreachable)"


def test_a_body_that_is_not_an_error_has_no_message() -> None:
    assert error_message(b"<html>Bad Gateway</html>") is None
    assert from_status(502, None).detail == "the control plane answered HTTP 502"


def test_the_cause_is_found_through_a_callers_own_wrapping_exception() -> None:
    class Unreachable(Exception):
        pass

    port = closed_port()
    with pytest.raises(Unreachable) as raised:
        try:
            httpx.get(f"http://127.0.0.1:{port}/")
        except httpx.HTTPError as exc:
            raise Unreachable("control plane unreachable") from exc

    assert classify(raised.value).cause == "connect"


def test_credentials_in_the_url_never_reach_the_detail() -> None:
    port = closed_port()
    url = f"http://vkgate:hunter2-password@127.0.0.1:{port}/healthz"
    failure = failure_of(url)
    assert "hunter2" not in failure.detail
    assert "vkgate:" not in failure.detail
    assert f"127.0.0.1:{port}" in failure.detail


def test_a_message_quoting_a_url_loses_its_credentials() -> None:
    failure = from_status(500, "cannot reach postgresql://admin:s3cret@db:5432/vkgate")
    assert "s3cret" not in failure.detail
    assert "postgresql://db:5432/vkgate" in failure.detail
