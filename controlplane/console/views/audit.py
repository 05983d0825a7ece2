"""The audit log: who changed what, filterable by resource, newest first, a page at a time."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from litestar import Request, get
from litestar.params import FromQuery
from litestar.response import Template
from sqlalchemy import select

from controlplane.console._core import PAGE_SIZE, open_page
from controlplane.errors import invalid
from controlplane.models import AuditEntry
from controlplane.schemas import MAX_ID, filtered

KINDS = [
    "organization",
    "team",
    "project",
    "provider",
    "routing_policy",
    "virtual_key",
    "budget",
    "admin_token",
]


@get("/audit")
async def audit(
    request: Request[Any, Any, Any],
    resource_kind: FromQuery[str | None] = None,
    resource_id: FromQuery[str | None] = None,
    before: FromQuery[str | None] = None,
) -> Template:
    view = await open_page(request)
    query = filtered(
        select(AuditEntry),
        {
            AuditEntry.resource_kind: resource_kind or None,
            AuditEntry.resource_id: (resource_id or "").strip() or None,
        },
    )
    if before:
        if not (before.isascii() and before.isdigit()) or int(before) > MAX_ID:
            raise invalid("before must be a page cursor this page gave", param="before")
        query = query.where(AuditEntry.id < int(before))
    async with view.vk.read() as tx:
        found = list(
            await tx.session.scalars(
                tx.scoped(query).order_by(AuditEntry.id.desc()).limit(PAGE_SIZE + 1)
            )
        )
    rows = found[:PAGE_SIZE]
    filters = {
        k: v for k, v in {"resource_kind": resource_kind, "resource_id": resource_id}.items() if v
    }
    older = None
    if len(found) > PAGE_SIZE:
        older = urlencode({**filters, "before": str(rows[-1].id)})
    return view.render(
        "audit.html",
        "audit",
        heading="Audit log",
        rows=rows,
        kinds=KINDS,
        filters=filters,
        older=older,
    )


HANDLERS = [audit]
