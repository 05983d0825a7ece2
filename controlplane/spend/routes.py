"""Spend routes: the finance reads (`/api/spend/…`) and the internal ones the proxies call."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromQuery, QueryParameter
from litestar.status_codes import HTTP_200_OK

from controlplane.errors import ApiError, invalid
from controlplane.ledger import queries
from controlplane.models import Organization
from controlplane.openapi import CsvAlternative
from controlplane.schemas import Vk
from controlplane.spend import reports, segments, service
from vkgate.logs import event
from vkgate.spend import (
    BUDGET_BUCKET_SPEND_PATH,
    SEGMENT_ENCODING,
    SPEND_COMMANDS_PATH,
    BudgetBucketSpend,
    SpendAck,
)

log = logging.getLogger("vkgate.controlplane.spend")

SPEND_SEGMENT_MAX_BYTES = 128 * 1024 * 1024
"""A segment holds a flush interval of a replica's records (~600 bytes each): far more than
an admin body, so this route has its own limit instead of VKGATE_CONTROLPLANE_MAX_BODY_BYTES.
It bounds the body as sent and, for a gzip body, what it inflates to."""
JSON = "application/json"
CSV = "text/csv; charset=utf-8"
NEXT_CURSOR_HEADER = "X-Vkgate-Next-Cursor"


class SpendReport(msgspec.Struct):
    """The JSON report (the route builds it as bytes; this only documents its shape)."""

    rows: list[dict[str, Any]]
    """One per group: its group fields, then the counts, tokens and `cost_usd`."""
    totals: dict[str, Any]


class LedgerPage(msgspec.Struct):
    """A JSON page of raw ledger rows (documentation only, like `SpendReport`)."""

    data: list[dict[str, Any]]
    next_cursor: str | None


From = Annotated[
    str | None, QueryParameter(name="from", description="Inclusive: RFC 3339 or a date (UTC)")
]
To = Annotated[
    str | None, QueryParameter(name="to", description="Exclusive: RFC 3339 or a date (UTC)")
]


class SpendController(Controller):
    """Read by the `admin` and `finance` roles; nothing here changes state."""

    path = "/api/spend"
    tags = ["spend"]

    @get(
        "/report",
        responses={
            200: ResponseSpec(
                SpendReport,
                description="The report (CSV with format=csv)",
                generate_examples=False,
            )
        },
        operation_class=CsvAlternative,
    )
    async def report(
        self,
        vk: Vk,
        organization_id: FromQuery[str | None] = None,
        start: From = None,
        end: To = None,
        group_by: FromQuery[str | None] = None,
        format: FromQuery[str | None] = None,
    ) -> Response[bytes]:
        """Requests (served), refusals, failures, tokens and cost, grouped by the fields of
        `group_by` (team, project, virtual_key, model, served_model, provider, end_user, day).
        A token bound to an organization may leave `organization_id` out: its own is read."""
        chosen = reports.parse_format(format)
        groups = reports.parse_group_by(group_by)
        period = await _period(vk, organization_id, start, end)
        organization_id = period.organization_id
        built = await reports.report(vk.ledger, period, groups)
        if chosen == "csv":
            return _csv(reports.to_csv(built.fields, built.rows), f"spend-{organization_id}")
        body = {"rows": built.rows, "totals": built.totals}
        return Response(msgspec.json.encode(body), media_type=JSON)

    @get(
        "/ledger",
        responses={
            200: ResponseSpec(
                LedgerPage, description="A page (CSV with format=csv)", generate_examples=False
            )
        },
        operation_class=CsvAlternative,
    )
    async def ledger(
        self,
        vk: Vk,
        organization_id: FromQuery[str | None] = None,
        start: From = None,
        end: To = None,
        cursor: FromQuery[str | None] = None,
        limit: FromQuery[int | None] = None,
        format: FromQuery[str | None] = None,
    ) -> Response[bytes]:
        """Raw ledger rows in time order, a page at a time (`next_cursor`; in CSV the
        X-Vkgate-Next-Cursor header)."""
        chosen = reports.parse_format(format)
        period = await _period(vk, organization_id, start, end)
        organization_id = period.organization_id
        rows, next_cursor = await reports.ledger_page(vk.ledger, period, cursor=cursor, limit=limit)
        if chosen == "csv":
            response = _csv(
                reports.to_csv(reports.LEDGER_FIELDS, rows), f"ledger-{organization_id}"
            )
            if next_cursor:
                response.headers[NEXT_CURSOR_HEADER] = next_cursor
            return response
        body = {"data": rows, "next_cursor": next_cursor}
        return Response(msgspec.json.encode(body), media_type=JSON)


async def _period(
    vk: Vk, organization_id: str | None, start: str | None, end: str | None
) -> queries.Period:
    """The period asked for, of the organization asked for, which must exist and be within the
    token's scope (404 otherwise, as for a missing one); without one, of the token's own."""
    if organization_id is None and vk.scope is None:
        raise invalid("the query parameter 'organization_id' is required", param="organization_id")
    chosen = organization_id or vk.scope or ""
    period = reports.parse_period(chosen, start, end)
    async with vk.read() as tx:
        await tx.get(Organization, chosen, "organization", param="organization_id")
    return period


def _csv(body: bytes, name: str) -> Response[bytes]:
    return Response(
        body,
        media_type=CSV,
        headers={"Content-Disposition": f'attachment; filename="{name}.csv"'},
    )


@post(SPEND_COMMANDS_PATH, status_code=HTTP_200_OK, request_max_body_size=SPEND_SEGMENT_MAX_BYTES)
async def spend_commands(vk: Vk, request: Request[Any, Any, Any]) -> SpendAck:
    """A spool segment into the ledger; the same segment twice changes nothing."""
    body = await request.body()
    encoding = request.headers.get("content-encoding")
    try:
        # Off the event loop: a full segment is thousands of records (and megabytes inflated).
        checked = await asyncio.to_thread(_read_segment, body, encoding)
    except ApiError as exc:
        # Said on a refusal too: a proxy that sent gzip then knows the body was read.
        exc.headers = {**exc.headers, "Accept-Encoding": SEGMENT_ENCODING}
        vk.metrics.spend_segments.labels("rejected").inc()
        # The proxy sets a refused segment aside (its `rejected/` directory): its spend is
        # missing from the ledger until someone looks, so this is a warning.
        event(
            log,
            "spend_segment_rejected",
            level=logging.WARNING,
            code=exc.code.value,
            bytes=len(body),
        )
        raise
    ack = await service.ingest(
        checked,
        db=vk.db,
        ledger=vk.ledger,
        pricer=vk.pricer,
        clock=vk.clock,
        notifier=vk.notifier,
        metrics=vk.metrics,
    )
    fresh = ack.accepted > 0 or ack.duplicates == 0
    vk.metrics.spend_segments.labels("accepted" if fresh else "duplicate").inc()
    vk.metrics.spend_records.inc(ack.accepted)
    return ack


def _read_segment(body: bytes, encoding: str | None) -> segments.CheckedSegment:
    return segments.check(
        segments.decode(segments.inflate(body, encoding, SPEND_SEGMENT_MAX_BYTES))
    )


@get(BUDGET_BUCKET_SPEND_PATH)
async def budget_bucket_spend(
    vk: Vk, budget_id: FromQuery[str], end_user: FromQuery[str]
) -> BudgetBucketSpend:
    return await service.bucket_spend(
        db=vk.db, ledger=vk.ledger, clock=vk.clock, budget_id=budget_id, end_user=end_user
    )
