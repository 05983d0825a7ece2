"""Virtual keys: the list, creation (the key shown once), rotation, disable, enable, revoke."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from litestar import Request, get, post
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template
from sqlalchemy import select

from controlplane.console import _choices
from controlplane.console._core import Form, convert, open_form, open_page, redirect
from controlplane.console.views.orgs import LIMIT_FIELDS, limits_of
from controlplane.errors import invalid
from controlplane.keys import service
from controlplane.keys.routes import key_read, key_reads, with_secret
from controlplane.keys.schemas import DEFAULT_GRACE_SECONDS, KeyCreate, KeyRotate
from controlplane.keys.service import KeyStatus
from controlplane.models import VirtualKey
from controlplane.schemas import filtered, page

STATUSES = [s.value for s in KeyStatus]


def _status(text: str | None) -> str | None:
    if not text:
        return None
    if text not in STATUSES:
        raise invalid(f"status must be one of {', '.join(STATUSES)}, got {text!r}", param="status")
    return text


def _expiry(form: Form) -> str | None:
    """The form's `datetime-local` value, read as UTC (the page says so)."""
    text = form.text("expires_at")
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise invalid(
            f"expires_at must be a date and time (UTC), got {text!r}", param="expires_at"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.isoformat()


@get("/keys")
async def keys(
    request: Request[Any, Any, Any],
    organization_id: FromQuery[str | None] = None,
    project_id: FromQuery[str | None] = None,
    status: FromQuery[str | None] = None,
    cursor: FromQuery[str | None] = None,
) -> Template:
    view = await open_page(request)
    chosen = _status(status)
    query = filtered(
        select(VirtualKey),
        {
            VirtualKey.organization_id: organization_id or None,
            VirtualKey.project_id: project_id or None,
            VirtualKey.status: chosen,
        },
    )
    async with view.vk.read() as tx:
        rows, next_cursor = await page(tx, query, VirtualKey.id, limit=50, cursor=cursor)
        reads = await key_reads(tx, list(rows)) if rows else []
        project_rows = await _choices.projects(tx)
        policy_rows = await _choices.policies(tx)
    filters = {
        k: v
        for k, v in {
            "organization_id": organization_id,
            "project_id": project_id,
            "status": chosen,
        }.items()
        if v
    }
    return view.render(
        "keys_table.html" if view.partial else "keys.html",
        "keys",
        heading="Virtual keys",
        rows=reads,
        next_cursor=next_cursor,
        filters=filters,
        statuses=STATUSES,
        projects=project_rows,
        project_names=_choices.names(project_rows),
        policies=policy_rows,
        policy_names=_choices.names(policy_rows),
        limit_fields=LIMIT_FIELDS,
    )


@post("/keys", status_code=200)
async def create_key(request: Request[Any, Any, Any]) -> Template:
    view, form = await open_form(request)
    data = convert(
        {
            "project_id": form.text("project_id"),
            "name": form.text("name"),
            "routing_policy_id": form.text("routing_policy_id"),
            "allowed_models": [
                m.strip() for m in (form.text("allowed_models") or "").split(",") if m.strip()
            ]
            or None,
            "limits": limits_of(form) or None,
            "expires_at": _expiry(form),
        },
        KeyCreate,
    )
    async with view.vk.write(view.actor.id) as tx:
        row, key = await service.create(tx, view.vk.hasher, data)
        created = await with_secret(tx, row, key)
    return view.render("key_secret.html", "keys", heading="Key created", key=created, rotated=False)


@post("/keys/{vk_id:str}/rotate", status_code=200)
async def rotate_key(request: Request[Any, Any, Any], vk_id: FromPath[str]) -> Template:
    view, form = await open_form(request)
    grace = form.integer("grace_seconds", "Grace")
    data = convert({"grace_seconds": DEFAULT_GRACE_SECONDS if grace is None else grace}, KeyRotate)
    async with view.vk.write(view.actor.id) as tx:
        row, key, valid_until = await service.rotate(
            tx, view.vk.hasher, vk_id, grace_seconds=data.grace_seconds
        )
        rotated = await with_secret(tx, row, key, valid_until)
    return view.render("key_secret.html", "keys", heading="Key rotated", key=rotated, rotated=True)


@post("/keys/{vk_id:str}/disable")
async def disable_key(request: Request[Any, Any, Any], vk_id: FromPath[str]) -> Redirect:
    view, _ = await open_form(request)
    async with view.vk.write(view.actor.id) as tx:
        await service.set_enabled(tx, vk_id, enabled=False)
    return redirect("/keys")


@post("/keys/{vk_id:str}/enable")
async def enable_key(request: Request[Any, Any, Any], vk_id: FromPath[str]) -> Redirect:
    view, _ = await open_form(request)
    async with view.vk.write(view.actor.id) as tx:
        await service.set_enabled(tx, vk_id, enabled=True)
    return redirect("/keys")


@get("/keys/{vk_id:str}/revoke")
async def confirm_revoke(request: Request[Any, Any, Any], vk_id: FromPath[str]) -> Template:
    view = await open_page(request)
    view.require_admin()
    async with view.vk.read() as tx:
        read = await key_read(tx, await tx.get(VirtualKey, vk_id, "virtual key"))
    return view.render("key_revoke.html", "keys", heading=f"Revoke key {read.name}?", key=read)


@post("/keys/{vk_id:str}/revoke")
async def revoke_key(request: Request[Any, Any, Any], vk_id: FromPath[str]) -> Redirect:
    view, _ = await open_form(request)
    async with view.vk.write(view.actor.id) as tx:
        await service.revoke(tx, vk_id)
    return redirect("/keys")


HANDLERS = [keys, create_key, rotate_key, disable_key, enable_key, confirm_revoke, revoke_key]
