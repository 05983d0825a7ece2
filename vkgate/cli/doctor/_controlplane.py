"""The doctor's checks of the control plane: its health routes and the signed internal API."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import msgspec

import vkgate
from vkgate import signing, versions
from vkgate.cli.doctor._result import Result, Status, shown_url
from vkgate.clock import Clock
from vkgate.errors import ErrorCode
from vkgate.probe import Failure, classify, error_message, from_status
from vkgate.wire import INTERNAL_PREFIX, ErrorBody, HealthResponse

CLOCK_SKEW_WARN_S = 60.0
"""Well inside the 300 s the internal API allows, so a drifting clock shows before it bites."""


def check_controlplane(http: httpx.Client) -> tuple[Result, bool]:
    """GET /healthz, then /readyz (`http` has the control plane's URL as its base); the result,
    and whether the control plane is up at all (it answered /healthz)."""
    where = shown_url(str(http.base_url).rstrip("/"))
    try:
        live = http.get("/healthz")
        if live.status_code != 200:
            failure = from_status(live.status_code, error_message(live.content))
            return Result("control plane", Status.FAIL, f"{where}: {failure}", failure.fix), False
        ready = http.get("/readyz")
    except httpx.HTTPError as exc:
        failure = classify(exc)
        return Result("control plane", Status.FAIL, f"{where}: {failure}", failure.fix), False
    try:
        fields = msgspec.json.decode(ready.content, type=dict[str, str | int | float | bool])
    except msgspec.DecodeError:
        fields = {}
    said = ", ".join(f"{name}={value}" for name, value in fields.items()) or "no JSON body"
    if ready.status_code != 200:
        return Result(
            "control plane",
            Status.FAIL,
            f"{where}: live, but /readyz answered {ready.status_code} ({said})",
            "the control plane cannot serve: see its log, and the database check here",
        ), True
    if fields.get("status") == "degraded":
        return Result(
            "control plane",
            Status.WARN,
            f"{where}: serving, but its spend ledger does not answer ({said})",
            "spend waits in the proxies' spools meanwhile: check the ledger named by "
            "VKGATE_LEDGER_URL on the control plane (the ledger check here, its log)",
        ), True
    return Result("control plane", Status.OK, f"{where}: live; /readyz: {said}"), True


def check_internal_api(
    http: httpx.Client, secret: str, clock: Clock, *, previous: str | None = None
) -> Result:
    """A signed GET of the internal API's health route, as a proxy makes it: with the current
    secret, and, when the control plane refuses that, with the previous one (a rotation the
    control planes have not caught up with yet)."""
    path = f"{INTERNAL_PREFIX}/health"
    where = shown_url(str(http.base_url).rstrip("/"))
    sent = clock.now()
    try:
        response = _signed_health(http, path, secret, sent)
        behind = False
        if previous is not None and _signature_refused(response):
            behind, sent = True, clock.now()
            response = _signed_health(http, path, previous, sent)
    except httpx.HTTPError as exc:
        failure = classify(exc)
        return Result("internal API", Status.FAIL, f"{where}: {failure}", failure.fix)
    if response.status_code != 200:
        failure = from_status(response.status_code, error_message(response.content))
        return Result("internal API", Status.FAIL, f"{where}: {failure}", failure.fix)
    try:
        health = msgspec.json.decode(response.content, type=HealthResponse)
        their_time = datetime.fromisoformat(health.time)
    except (msgspec.DecodeError, ValueError):
        failure = Failure("protocol", "the health answer is not a vkgate control plane's")
        return Result("internal API", Status.FAIL, f"{where}: {failure}", failure.fix)
    if their_time.tzinfo is None:
        # vkgate's wire is UTC: a time without an offset (an older or foreign writer) is UTC too,
        # and comparing it with this clock's aware time would raise.
        their_time = their_time.replace(tzinfo=UTC)
    midpoint = sent + (clock.now() - sent) / 2
    skew = (their_time - midpoint).total_seconds()
    found = (
        f"signed round trip ok: revision {health.revision}, version {health.version}, "
        f"clocks {abs(skew):.0f} s apart"
    )
    version_mismatch = versions.mismatch(vkgate.__version__, health.version)
    if version_mismatch is not None:
        return Result("internal API", Status.FAIL, f"{found}; {version_mismatch}", versions.FIX)
    if behind:
        return Result(
            "internal API",
            Status.WARN,
            f"{found}, but only with VKGATE_INTERNAL_SECRET_PREVIOUS: the control plane does "
            "not take VKGATE_INTERNAL_SECRET yet",
            "give every control plane the new VKGATE_INTERNAL_SECRET (with the old one as "
            "VKGATE_INTERNAL_SECRET_PREVIOUS) before taking the old one away from anything",
        )
    if abs(skew) > CLOCK_SKEW_WARN_S:
        return Result(
            "internal API",
            Status.WARN,
            found,
            f"sync this machine's clock with the control plane's (NTP): at more than "
            f"{signing.MAX_SKEW_SECONDS} s apart every signed call is refused",
        )
    return Result("internal API", Status.OK, found)


def _signed_health(http: httpx.Client, path: str, secret: str, sent: datetime) -> httpx.Response:
    return http.get(
        path, headers=signing.signed_headers(secret, "GET", path, b"", sent.timestamp())
    )


def _signature_refused(response: httpx.Response) -> bool:
    if response.status_code != 401:
        return False
    try:
        body = msgspec.json.decode(response.content, type=ErrorBody)
    except msgspec.DecodeError:
        return False
    return body.error.code == ErrorCode.BAD_SIGNATURE
