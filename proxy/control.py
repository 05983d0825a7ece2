"""The proxy's signed client of the control plane's internal API (off the hot path: httpx)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlencode

import httpx
import msgspec

import vkgate
from vkgate import signing
from vkgate.clock import Clock
from vkgate.errors import ErrorCode
from vkgate.probe import Failure, classify, error_message, from_status
from vkgate.spend import SEGMENT_ENCODING, SPEND_COMMANDS_PATH, BudgetBucketSpend, SpendAck
from vkgate.wire import (
    INTERNAL_PREFIX,
    REVISION_HEADER,
    VERSION_HEADER,
    ChangesResponse,
    ConfigBundle,
    ErrorBody,
    HealthResponse,
    ResolveKeyRequest,
    ResolveKeyResponse,
)

T = TypeVar("T")


class Unreachable(Exception):
    """The control plane could not be asked, or failed to answer (network, 5xx, bad reply)."""


class Refused(Exception):
    """The control plane answered that the key cannot be used (401, 403 or 404), or that it will
    never take a spend segment (`takes_gzip`: its answer said it reads gzip segments)."""

    def __init__(self, code: ErrorCode, message: str, *, takes_gzip: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.takes_gzip = takes_gzip


@dataclass(frozen=True, slots=True)
class Config:
    bundle: ConfigBundle | None
    """None when unchanged since the ETag sent."""
    etag: str | None


_REFUSED_BY_STATUS = {
    401: ErrorCode.INVALID_API_KEY,
    403: ErrorCode.VIRTUAL_KEY_REVOKED,
    404: ErrorCode.INVALID_API_KEY,
}


SHIP_TIMEOUT_S = 60.0
GZIP_LEVEL = 1
"""A segment's JSON shrinks about 7 times at level 1, in some 4 ms a MiB (off the event loop);
higher levels gain a few per cent for twice the time."""


class ControlPlaneClient:
    def __init__(
        self,
        base_url: str,
        secret: str,
        clock: Clock,
        *,
        previous_secret: str | None = None,
        timeout_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._secrets = (secret,) if previous_secret is None else (secret, previous_secret)
        """The secrets to sign with, the one the control plane took last first."""
        self._clock = clock
        self.gzip_segments: bool | None = None
        """Whether the control plane's last successful answer said it takes gzip segments; None
        until one came."""
        self._http = httpx.AsyncClient(
            base_url=base_url,
            timeout=timeout_s,
            transport=transport,
            # Every call names this proxy's release: the control plane counts and checks them.
            headers={"User-Agent": "vkgate-proxy", VERSION_HEADER: vkgate.__version__},
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(
        self,
        method: str,
        path_and_query: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        response = await self._send(method, path_and_query, body, headers, timeout_s)
        if response.status_code in _REFUSED_BY_STATUS:
            raise _refusal(response)
        if response.status_code >= 400:
            raise Unreachable(f"control plane answered {response.status_code}")
        return response

    async def _send(
        self,
        method: str,
        path_and_query: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        """One signed call; a network failure is `Unreachable`, any status is the caller's.

        While the internal secret rolls across the replicas, a control plane may know only one
        of the two the proxy has: a signature it refuses is made again with the other, which is
        then used first, so replicas can be rolled in any order.
        """
        path = INTERNAL_PREFIX + path_and_query
        response = await self._signed(self._secrets[0], method, path, body, headers, timeout_s)
        if len(self._secrets) > 1 and _signature_refused(response):
            other = self._secrets[1]
            retried = await self._signed(other, method, path, body, headers, timeout_s)
            if not _signature_refused(retried):
                self._secrets = (other, self._secrets[0])
            response = retried
        if response.status_code < 400:
            # Errors are left out: one may come from a reverse proxy in front, not from it.
            self.gzip_segments = _takes_gzip(response.headers.get("accept-encoding"))
        return response

    async def _signed(
        self,
        secret: str,
        method: str,
        path: str,
        body: bytes,
        headers: dict[str, str] | None,
        timeout_s: float | None,
    ) -> httpx.Response:
        signed = signing.signed_headers(secret, method, path, body, self._clock.time())
        if body:
            signed["Content-Type"] = "application/json"
        try:
            return await self._http.request(
                method,
                path,
                content=body,
                headers={**signed, **(headers or {})},
                timeout=timeout_s if timeout_s is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.HTTPError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from exc

    async def resolve_key(self, key_sha256: str) -> ResolveKeyResponse:
        body = msgspec.json.encode(ResolveKeyRequest(key_sha256=key_sha256))
        response = await self._call("POST", "/resolve-key", body)
        return _decode(response, ResolveKeyResponse)

    async def config(self, vk_id: str, etag: str | None = None) -> Config:
        headers = {"If-None-Match": etag} if etag else None
        response = await self._call("GET", f"/config/{vk_id}", headers=headers)
        if response.status_code == 304:
            return Config(None, etag)
        return Config(_decode(response, ConfigBundle), response.headers.get("ETag"))

    async def changes(self, since: int, timeout_s: float) -> ChangesResponse:
        """Events after `since`; an empty list (with the revision) when none came in time."""
        response = await self._call(
            "GET",
            f"/changes?since={since}&timeout_s={timeout_s:g}",
            timeout_s=timeout_s + 10.0,
        )
        if response.status_code == 204:
            try:
                revision = int(response.headers.get(REVISION_HEADER, ""))
            except ValueError:
                raise Unreachable("control plane's 204 carried no revision") from None
            return ChangesResponse(events=[], current_revision=revision)
        return _decode(response, ChangesResponse)

    async def bucket_spend(self, budget_id: str, end_user: str) -> BudgetBucketSpend:
        """One end user's spend in a per-end-user budget's current window, from the ledger."""
        query = urlencode({"budget_id": budget_id, "end_user": end_user})
        response = await self._call("GET", f"/budget-bucket-spend?{query}")
        return _decode(response, BudgetBucketSpend)

    async def health(self) -> HealthResponse:
        return _decode(await self._call("GET", "/health"), HealthResponse)

    async def check_health(self) -> HealthResponse | Failure:
        """A signed round trip, or what failed in it (DNS, connect, TLS, signature, ...)."""
        try:
            response = await self._send("GET", "/health")
        except Unreachable as exc:
            return classify(exc.__cause__ or exc)
        if response.status_code >= 300:
            return from_status(response.status_code, error_message(response.content))
        try:
            return _decode(response, HealthResponse)
        except Unreachable as exc:
            return Failure("protocol", str(exc))

    async def ship_spend(self, segment: bytes) -> SpendAck:
        """Hand one spool segment (a `SpendSegment` as JSON) to the ledger.

        Gzipped (in a thread) once the control plane's answers say it takes that; before the
        first shipment, when nothing has answered yet, it is asked.

        `Refused` when the control plane will never take this segment (400, 422, or a 413 for
        a gzip body): sending it again cannot help. `Unreachable` for anything else, a refused
        signature included: the segment is fine and is sent again later. So is a segment
        refused as too large as it is (a reverse proxy's body limit in front of a control plane
        that does not take gzip): it goes once the limit is raised or gzip is taken.
        """
        if self.gzip_segments is None:
            with contextlib.suppress(Unreachable):
                await self._send("GET", "/health")
        if self.gzip_segments:
            packed = await asyncio.to_thread(gzip.compress, segment, GZIP_LEVEL, mtime=0)
            try:
                return await self._ship(packed, SEGMENT_ENCODING)
            except Refused as refusal:
                if refusal.takes_gzip:
                    raise  # read, and refused for what it holds
                # Not read: a control plane that cannot take gzip after all (an older replica
                # behind the same address). Sent again as it is.
                self.gzip_segments = False
        return await self._ship(segment, None)

    async def _ship(self, body: bytes, encoding: str | None) -> SpendAck:
        headers = {"Content-Encoding": encoding} if encoding else None
        # A large segment takes the ledger a while: a short timeout would only ship it again.
        response = await self._send(
            "POST", SPEND_COMMANDS_PATH, body, headers, timeout_s=SHIP_TIMEOUT_S
        )
        status = response.status_code
        if status == 413 and encoding is None:
            raise Unreachable(
                f"a spend segment of {len(body)} bytes was refused as too large: raise the body "
                "limit in front of the control plane, or run one that takes gzip segments"
            )
        if status in _SEGMENT_REFUSED:
            takes_gzip = _takes_gzip(response.headers.get("accept-encoding"))
            raise Refused(_SEGMENT_REFUSED[status], _error_message(response), takes_gzip=takes_gzip)
        if status >= 300:
            raise Unreachable(f"control plane answered {status} to a spend segment")
        return _decode(response, SpendAck)


def _takes_gzip(accept_encoding: str | None) -> bool:
    """Whether an `Accept-Encoding` list names gzip with a weight above 0."""
    for part in (accept_encoding or "").split(","):
        coding, _, weight = part.partition(";")
        if coding.strip().lower() == SEGMENT_ENCODING:
            q = weight.strip().lower().removeprefix("q=")
            try:
                return not q or float(q) > 0
            except ValueError:
                return False
    return False


def _decode(response: httpx.Response, kind: type[T]) -> T:
    try:
        return msgspec.json.decode(response.content, type=kind)
    except msgspec.DecodeError as exc:
        raise Unreachable(f"control plane sent an unreadable answer: {exc}") from None


_SEGMENT_REFUSED = {
    400: ErrorCode.INVALID_REQUEST,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
    422: ErrorCode.VALIDATION_ERROR,
}


class _Message(msgspec.Struct):
    message: str


class _Error(msgspec.Struct):
    error: _Message


def _error_message(response: httpx.Response) -> str:
    """The error's message, from any error body that has one."""
    try:
        return msgspec.json.decode(response.content, type=_Error).error.message
    except msgspec.DecodeError:
        return f"HTTP {response.status_code}"


def _signature_refused(response: httpx.Response) -> bool:
    if response.status_code != 401:
        return False
    try:
        return msgspec.json.decode(response.content, type=ErrorBody).error.code == (
            ErrorCode.BAD_SIGNATURE
        )
    except msgspec.DecodeError:
        return False


def _refusal(response: httpx.Response) -> Refused:
    fallback = _REFUSED_BY_STATUS[response.status_code]
    try:
        detail = msgspec.json.decode(response.content, type=ErrorBody).error
    except msgspec.DecodeError:
        return Refused(fallback, "virtual key refused")
    try:
        code = ErrorCode(detail.code)
    except ValueError:
        code = fallback
    if code is ErrorCode.BAD_SIGNATURE:
        # Our own signature was refused: a misconfigured secret, not a bad key.
        raise Unreachable(
            "control plane refused the proxy's signature; check VKGATE_INTERNAL_SECRET"
        )
    if code in (ErrorCode.NOT_FOUND, ErrorCode.UNAUTHORIZED):
        code = ErrorCode.INVALID_API_KEY
    return Refused(code, detail.message)
