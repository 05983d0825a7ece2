"""Organizations, teams (with their shared rate limits) and projects."""

from __future__ import annotations

from typing import Any

from litestar import Request, get, post
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template
from sqlalchemy import select

from controlplane.console import _choices
from controlplane.console._core import Form, convert, open_form, open_page, redirect
from controlplane.errors import ApiError
from controlplane.models import Organization, Project, Team
from controlplane.orgs import service
from controlplane.orgs.schemas import OrganizationCreate, ProjectCreate, TeamCreate, TeamUpdate
from controlplane.schemas import RateLimits, filtered, page
from vkgate.errors import ErrorCode

LIMIT_FIELDS = (
    ("rpm", "Requests a minute"),
    ("tpm", "Tokens a minute"),
    ("rpd", "Requests a day"),
    ("max_concurrency", "Requests at once"),
)


def limits_of(form: Form) -> dict[str, int]:
    given = {name: form.integer(name, label) for name, label in LIMIT_FIELDS}
    return {name: value for name, value in given.items() if value is not None}


@get("/organizations")
async def organizations(
    request: Request[Any, Any, Any], cursor: FromQuery[str | None] = None
) -> Template:
    view = await open_page(request)
    async with view.vk.read() as tx:
        rows, next_cursor = await page(
            tx, select(Organization), Organization.id, limit=50, cursor=cursor
        )
    return view.render(
        "organizations.html",
        "organizations",
        heading="Organizations",
        rows=rows,
        next_cursor=next_cursor,
        may_create=view.sees_tokens,
    )


@post("/organizations")
async def create_organization(request: Request[Any, Any, Any]) -> Redirect:
    view, form = await open_form(request)
    if view.actor.organization_id is not None:
        raise ApiError(
            ErrorCode.FORBIDDEN,
            "this needs an admin token bound to no organization; this one is bound to one",
        )
    data = convert({"name": form.text("name")}, OrganizationCreate)
    async with view.vk.write(view.actor.id) as tx:
        await service.create_organization(tx, name=data.name)
    return redirect("/organizations")


@get("/teams")
async def teams(
    request: Request[Any, Any, Any],
    organization_id: FromQuery[str | None] = None,
    cursor: FromQuery[str | None] = None,
) -> Template:
    view = await open_page(request)
    query = filtered(select(Team), {Team.organization_id: organization_id or None})
    async with view.vk.read() as tx:
        rows, next_cursor = await page(tx, query, Team.id, limit=50, cursor=cursor)
        orgs = await _choices.organizations(tx)
    return view.render(
        "teams.html",
        "teams",
        heading="Teams",
        rows=rows,
        next_cursor=next_cursor,
        organizations=orgs,
        org_names=_choices.names(orgs),
        chosen_org=organization_id or "",
        limit_fields=LIMIT_FIELDS,
    )


@post("/teams")
async def create_team(request: Request[Any, Any, Any]) -> Redirect:
    view, form = await open_form(request)
    data = convert(
        {
            "organization_id": form.text("organization_id"),
            "name": form.text("name"),
            "limits": limits_of(form) or None,
        },
        TeamCreate,
    )
    async with view.vk.write(view.actor.id) as tx:
        await service.create_team(
            tx, organization_id=data.organization_id, name=data.name, limits=data.limits
        )
    return redirect("/teams")


@post("/teams/{team_id:str}/limits")
async def set_team_limits(request: Request[Any, Any, Any], team_id: FromPath[str]) -> Redirect:
    view, form = await open_form(request)
    limits = limits_of(form)
    data = TeamUpdate(limits=convert(limits, RateLimits) if limits else None)
    async with view.vk.write(view.actor.id) as tx:
        await service.update_team(tx, team_id=team_id, data=data)
    return redirect("/teams")


@get("/projects")
async def projects(
    request: Request[Any, Any, Any],
    organization_id: FromQuery[str | None] = None,
    cursor: FromQuery[str | None] = None,
) -> Template:
    view = await open_page(request)
    query = filtered(select(Project), {Project.organization_id: organization_id or None})
    async with view.vk.read() as tx:
        rows, next_cursor = await page(tx, query, Project.id, limit=50, cursor=cursor)
        orgs = await _choices.organizations(tx)
        team_rows = await _choices.teams(tx)
    return view.render(
        "projects.html",
        "projects",
        heading="Projects",
        rows=rows,
        next_cursor=next_cursor,
        organizations=orgs,
        org_names=_choices.names(orgs),
        teams=team_rows,
        team_names=_choices.names(team_rows),
        chosen_org=organization_id or "",
    )


@post("/projects")
async def create_project(request: Request[Any, Any, Any]) -> Redirect:
    view, form = await open_form(request)
    data = convert(
        {
            "organization_id": form.text("organization_id"),
            "name": form.text("name"),
            "team_id": form.text("team_id"),
        },
        ProjectCreate,
    )
    async with view.vk.write(view.actor.id) as tx:
        await service.create_project(
            tx, organization_id=data.organization_id, name=data.name, team_id=data.team_id
        )
    return redirect("/projects")


HANDLERS = [
    organizations,
    create_organization,
    teams,
    create_team,
    set_team_limits,
    projects,
    create_project,
]
