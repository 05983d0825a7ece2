"""Why a signed round trip to the control plane failed: one cause per failure, and its fix."""

from __future__ import annotations

import re
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import httpx
import msgspec

Cause = Literal["dns", "connect", "tls", "timeout", "signature", "http", "protocol"]

MAX_DETAIL = 240

# What to do about each cause, said once for the proxy's /health and `vkgate doctor` alike.
FIXES: dict[Cause, str] = {
    "dns": "check the host name in VKGATE_CONTROLPLANE_URL (and this machine's DNS)",
    "connect": (
        "is `vkgate controlplane` running and listening on that address? Compare its "
        "VKGATE_CONTROLPLANE_ADDR with VKGATE_CONTROLPLANE_URL here, and any firewall between"
    ),
    "tls": (
        "check the scheme in VKGATE_CONTROLPLANE_URL (http:// for a plain listener, https:// "
        "only behind TLS) and that the certificate is valid for that host and trusted here"
    ),
    "timeout": (
        "the control plane did not answer in time: is it overloaded or stuck, or is a "
        "firewall or proxy in between dropping traffic?"
    ),
    "signature": (
        "set the same VKGATE_INTERNAL_SECRET on the proxy and on the control plane, and keep "
        "both machines' clocks in sync (NTP)"
    ),
    "http": "see the control plane's log for why it answered this status",
    "protocol": (
        "check that VKGATE_CONTROLPLANE_URL names a vkgate control plane, not another service "
        "or a proxy in front of it"
    ),
}


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a round trip failed: `cause` is one of `Cause`, `detail` a short sentence."""

    cause: Cause
    detail: str

    @property
    def fix(self) -> str:
        return FIXES[self.cause]

    def __str__(self) -> str:
        return f"{self.cause}: {self.detail}"


def classify(exc: BaseException) -> Failure:
    """The cause of a failed request, found anywhere in the exception's chain.

    The chain is read rather than the outer type alone: httpx raises `ConnectError` for a DNS
    failure, a refused connection and a failed TLS handshake alike, and callers (the proxy's
    `Unreachable`) wrap httpx's exceptions in their own.
    """
    chain = list(_chain(exc))
    host, where = _target(chain)
    for item in chain:
        if isinstance(item, socket.gaierror):
            name = f" {host!r}" if host else ""
            return Failure("dns", f"cannot resolve the host name{name} ({_reason(item)})")
    for item in chain:
        if isinstance(item, ssl.SSLError):
            return Failure("tls", f"the TLS handshake{_with(where)} failed ({_tls_reason(item)})")
    for item in chain:
        if isinstance(item, httpx.ConnectTimeout):
            return Failure("timeout", f"no connection{_to(where)} within the timeout")
        if isinstance(item, httpx.ReadTimeout):
            return Failure(
                "timeout",
                f"{where or 'the server'} accepted the request but sent no answer in time",
            )
        if isinstance(item, httpx.TimeoutException | TimeoutError):
            return Failure("timeout", f"the request{_to(where)} timed out")
    for item in chain:
        if isinstance(item, ConnectionRefusedError):
            return Failure(
                "connect", f"nothing accepts connections{_at(where)} (connection refused)"
            )
    for item in chain:
        if isinstance(item, httpx.ConnectError):
            return Failure("connect", f"cannot connect{_to(where)} ({_reason(item)})")
    outer = next((item for item in chain if isinstance(item, httpx.HTTPError)), exc)
    reason = f"{type(outer).__name__}: {_reason(outer)}"
    if isinstance(outer, httpx.ProtocolError):
        return Failure(
            "protocol",
            _short(f"{where or 'the server'} did not answer as an HTTP server should ({reason})"),
        )
    return Failure("protocol", _short(f"the request{_to(where)} failed ({reason})"))


def from_status(status: int, body_message: str | None) -> Failure:
    """The cause of an unwanted status from the internal API (`body_message`: the error's
    `message`, see `error_message`)."""
    said = f" ({_short(scrub_credentials(body_message))})" if body_message else ""
    if status == 401:
        # The control plane's message ends in what it found wrong (mismatch, skew, missing):
        # both reasons are named, the likelier first, since either gives the same 401.
        secret = "VKGATE_INTERNAL_SECRET differs from the control plane's"
        clocks = "the two clocks differ by more than 300 s"
        first, second = (
            (clocks, secret)
            if body_message and "skew" in body_message
            else (
                secret,
                clocks,
            )
        )
        return Failure(
            "signature", f"the control plane refused the signature{said}: {first}, or {second}"
        )
    return Failure("http", f"the control plane answered HTTP {status}{said}")


class _Detail(msgspec.Struct):
    message: str


class _ErrorBody(msgspec.Struct):
    error: _Detail


def error_message(body: bytes) -> str | None:
    """The `error.message` of a vkgate error body; None when the body is not one."""
    try:
        return msgspec.json.decode(body, type=_ErrorBody).error.message
    except msgspec.DecodeError:
        return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, then its causes and contexts, each once, nearest first."""
    seen: set[int] = set()
    waiting: list[BaseException] = [exc]
    while waiting:
        item = waiting.pop(0)
        if id(item) in seen:
            continue
        seen.add(id(item))
        yield item
        waiting.extend(e for e in (item.__cause__, item.__context__) if e is not None)


def _target(chain: list[BaseException]) -> tuple[str | None, str | None]:
    """The host, and `host:port`, of the request that failed: never its URL, which may carry
    credentials."""
    for item in chain:
        if isinstance(item, httpx.HTTPError):
            try:
                url = item.request.url
            except RuntimeError:  # an httpx error raised without its request
                continue
            port = url.port or {"http": 80, "https": 443}.get(url.scheme)
            shown = f"[{url.host}]" if ":" in url.host else url.host
            return url.host, f"{shown}:{port}" if port else shown
    return None, None


def _at(where: str | None) -> str:
    return f" at {where}" if where else ""


def _to(where: str | None) -> str:
    return f" to {where}" if where else ""


def _with(where: str | None) -> str:
    return f" with {where}" if where else ""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return _short(exc.strerror)
    text = str(exc).strip()
    return _short(scrub_credentials(text.splitlines()[0])) if text else type(exc).__name__


def _tls_reason(exc: ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"certificate: {exc.verify_message}"
    if exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    return _reason(exc)


_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")


def scrub_credentials(text: str) -> str:
    """Credentials in any URL quoted by a message are cut out."""
    return _USERINFO.sub("", text)


def _short(text: str) -> str:
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"
