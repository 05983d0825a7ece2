"""Internal API routes (`/api/internal/gateway/`), all behind the signature guard."""

from __future__ import annotations

import hashlib
import hmac
import logging
from datetime import datetime
from typing import Any

import msgspec
from litestar import Request, Response, Router, get, post
from litestar.datastructures import ResponseHeader
from litestar.params import FromPath, FromQuery, JSONBody
from litestar.status_codes import HTTP_200_OK, HTTP_204_NO_CONTENT, HTTP_304_NOT_MODIFIED

import vkgate
from controlplane.errors import ApiError, invalid
from controlplane.feed import service as feed
from controlplane.internal import bundle
from controlplane.internal.resolve import resolve
from controlplane.internal.signature import require_signature
from controlplane.ledger.client import LedgerError
from controlplane.rehash import rehash_key
from controlplane.schemas import Vk
from controlplane.spend import service as spend
from controlplane.spend.routes import budget_bucket_spend, spend_commands
from controlplane.state import AppState
from vkgate.clock import rfc3339
from vkgate.errors import ErrorCode
from vkgate.logs import event
from vkgate.spend import SEGMENT_ENCODING
from vkgate.wire import (
    CHANGES_DEFAULT_TIMEOUT_S,
    CHANGES_MAX_EVENTS,
    CHANGES_MAX_TIMEOUT_S,
    INTERNAL_PREFIX,
    REVISION_HEADER,
    VERSION_HEADER,
    ChangeEvent,
    ChangesResponse,
    ConfigBundle,
    EventKind,
    HealthResponse,
    ResolveKeyRequest,
    ResolveKeyResponse,
)

JSON = "application/json"
log = logging.getLogger("vkgate.controlplane.internal")


# resolve-key's refusals as its metric counts them; any other ApiError is `invalid`.
RESOLVE_RESULTS = {
    ErrorCode.INVALID_API_KEY: "unknown",
    ErrorCode.VIRTUAL_KEY_REVOKED: "revoked",
    ErrorCode.VIRTUAL_KEY_DISABLED: "disabled",
    ErrorCode.VIRTUAL_KEY_EXPIRED: "expired",
}


@post("/resolve-key", status_code=HTTP_200_OK)
async def resolve_key(data: JSONBody[ResolveKeyRequest], vk: Vk) -> ResolveKeyResponse:
    """The key behind a SHA-256, and its bundle: one round trip for a key a proxy has not
    cached, and for the resolution it renews every few minutes, instead of two."""
    result = "error"
    try:
        now = vk.clock.now()
        async with vk.read() as tx:
            resolution = await resolve(tx, vk.hasher, vk.settings.jwt_secret, data.key_sha256)
            resolved = resolution.answer
            built = await bundle.build(
                tx, cipher=vk.cipher, pricer=vk.pricer, vk_id=resolved.vk_id, now=now
            )
        if resolution.stale_hash is not None:
            secret_id, old, new = resolution.stale_hash
            await rehash_key(
                vk.db,
                secret_id=secret_id,
                vk_id=resolved.vk_id,
                old=old,
                new=new,
                pepper_id=vk.hasher.pepper_id,
            )
        try:
            resolved.bundle, resolved.etag, _ = await _sent(vk, built, now)
        except LedgerError as exc:
            # The key still resolves: a proxy then asks `config`, which says the ledger is
            # down, and keeps serving what it cached meanwhile.
            vk.metrics.ledger_errors.inc()
            event(
                log,
                "ledger_unavailable",
                level=logging.WARNING,
                route=f"{INTERNAL_PREFIX}/resolve-key",
                method="POST",
                cause=exc.cause,
            )
        result = "ok"
    except ApiError as exc:
        result = RESOLVE_RESULTS.get(exc.code, "invalid")
        raise
    finally:
        vk.metrics.resolve_key.labels(result).inc()
    return resolved


@get("/config/{vk_id:str}")
async def config(vk_id: FromPath[str], vk: Vk, request: Request[Any, Any, Any]) -> Response[bytes]:
    result = "error"
    try:
        response = await _config(vk, vk_id, request.headers.get("if-none-match"))
        result = "not_modified" if response.status_code == HTTP_304_NOT_MODIFIED else "full"
    except ApiError:
        result = "refused"
        raise
    finally:
        vk.metrics.config.labels(result).inc()
    return response


async def _config(vk: AppState, vk_id: str, if_none_match: str | None) -> Response[bytes]:
    now = vk.clock.now()
    async with vk.read() as tx:
        built = await bundle.build(tx, cipher=vk.cipher, pricer=vk.pricer, vk_id=vk_id, now=now)
    sent, etag, encoded = await _sent(vk, built, now)
    if _matches(if_none_match, etag):
        return Response(b"", status_code=HTTP_304_NOT_MODIFIED, headers={"ETag": etag})
    return Response(
        encoded if encoded is not None else msgspec.json.encode(sent),
        media_type=JSON,
        headers={"ETag": etag, "Cache-Control": "no-store"},
    )


async def _sent(
    vk: AppState, built: ConfigBundle, now: datetime
) -> tuple[ConfigBundle, str, bytes | None]:
    """The bundle as sent, its budgets' spend read from the ledger, and its ETag; and the
    bundle's JSON when that is what is sent (no budgets), already encoded for the ETag."""
    # Read after the transaction: no database connection is held while the ledger answers.
    try:
        counted, as_of = await spend.with_spend(vk.ledger, built, now)
    except LedgerError:
        # The last figures read of each budget, with their age; none saved for a budget (one
        # never read): the ledger's failure stands.
        last = await vk.readings.last(built)
        if last is None:
            raise
        vk.metrics.stale_spend_bundles.inc()
        return last, _etag(vk, msgspec.json.encode(last)), None
    if counted.budgets:
        await vk.readings.remember(counted, as_of)
    # The ETag changes only when the bundle or a budget's spend does, not with the time the
    # spend was read: a proxy keeping an older reading only counts more conservatively.
    tagged = msgspec.json.encode(counted)
    etag = _etag(vk, tagged)
    if counted.budgets:
        return spend.read_at(counted, as_of), etag, None
    return counted, etag, tagged


def _etag(vk: AppState, tagged: bytes) -> str:
    # Keyed, so a tag reveals nothing about the credentials inside the bundle. Under the oldest
    # internal secret in force: while a new one rolls across the control planes, replicas with
    # and without it give the same tag, so a proxy's revalidation stays a 304 whichever answers.
    key = vk.settings.internal_secrets[-1].encode()
    digest = hmac.new(key, tagged, hashlib.sha256).hexdigest()
    return f'"{digest[:32]}"'


def _matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 weak comparison against a list of tags, or `*`."""
    if not if_none_match:
        return False
    tags = {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    return "*" in tags or etag in tags


@get("/changes")
async def changes(
    vk: Vk,
    since: FromQuery[int] = 0,
    organization_id: FromQuery[str | None] = None,
    timeout_s: FromQuery[float] = CHANGES_DEFAULT_TIMEOUT_S,
) -> Response[bytes]:
    """Events after `since`, or 204 once `timeout_s` passes with none.

    A commit in this process wakes the wait at once, and on PostgreSQL so does a commit in
    another replica (feed/listener.py); the periodic re-read is the fallback should that
    notification be lost. No database connection is held while waiting. A control plane that
    is shutting down answers at once instead of waiting (lifecycle.py).
    """
    if since < 0:
        raise invalid("since must be 0 or more", param="since")
    if timeout_s < 0:
        raise invalid("timeout_s must be 0 or more", param="timeout_s")
    timeout_s = min(timeout_s, CHANGES_MAX_TIMEOUT_S)
    deadline = vk.clock.monotonic() + timeout_s
    while True:
        # Taken before the read, so a write committing after it still ends the wait below.
        ticket = vk.notifier.ticket()
        async with vk.read() as tx:
            # The counter first: every event up to it has committed (see feed.append).
            current = await feed.current_revision(tx.session)
            vk.metrics.feed_revision.set(current)
            rows = await feed.read(
                tx.session,
                since=since,
                up_to=current,
                organization_id=organization_id,
                limit=CHANGES_MAX_EVENTS,
            )
        # `since` ahead of the feed means the store was reset: answer now so the caller resyncs.
        if rows or since > current:
            complete_to = rows[-1].revision if len(rows) == CHANGES_MAX_EVENTS else current
            events = [
                ChangeEvent(
                    revision=r.revision,
                    kind=EventKind(r.kind),
                    organization_id=r.organization_id,
                    entity_kind=r.entity_kind,
                    entity_id=r.entity_id,
                    at=rfc3339(r.at),
                    vk_id=r.vk_id,
                )
                for r in rows
            ]
            return Response(
                msgspec.json.encode(ChangesResponse(events=events, current_revision=complete_to)),
                media_type=JSON,
            )
        remaining = deadline - vk.clock.monotonic()
        # Draining was set before the wake-up that ended the last wait: it is seen here.
        if remaining <= 0 or vk.lifecycle.draining:
            return Response(
                b"", status_code=HTTP_204_NO_CONTENT, headers={REVISION_HEADER: str(current)}
            )
        await vk.notifier.wait(min(remaining, vk.settings.feed_poll_interval_s), ticket)


@get("/health")
async def health(vk: Vk) -> HealthResponse:
    async with vk.read() as tx:
        revision = await feed.current_revision(tx.session)
    vk.metrics.feed_revision.set(revision)
    return HealthResponse(
        status="ok", revision=revision, time=rfc3339(vk.clock.now()), version=vkgate.__version__
    )


internal_router = Router(
    path=INTERNAL_PREFIX,
    route_handlers=[
        resolve_key,
        config,
        changes,
        health,
        spend_commands,
        budget_bucket_spend,
    ],
    guards=[require_signature],
    # Spend segments may come gzipped (vkgate.spend.SEGMENT_ENCODING): said on every answer (a
    # proxy asks `health` before its first shipment if nothing answered it yet).
    response_headers=[
        ResponseHeader(name="Accept-Encoding", value=SEGMENT_ENCODING),
        # The proxy learns this control plane's release from every answer (vkgate/versions.py).
        ResponseHeader(name=VERSION_HEADER, value=vkgate.__version__),
    ],
    include_in_schema=False,
)
