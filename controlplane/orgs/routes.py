"""Admin routes for organizations, teams and projects."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, get, patch, post
from litestar.params import FromPath, FromQuery, JSONBody
from sqlalchemy import select

from controlplane.auth import UNBOUND_ONLY
from controlplane.models import Organization, Project, Team
from controlplane.orgs import service
from controlplane.orgs.schemas import (
    OrganizationCreate,
    OrganizationRead,
    ProjectCreate,
    ProjectRead,
    TeamCreate,
    TeamRead,
    TeamUpdate,
)
from controlplane.schemas import (
    Page,
    RateLimits,
    Vk,
    actor_id,
    check_limits_are_integers,
    filtered,
    page,
)
from vkgate.clock import rfc3339


def organization_read(row: Organization) -> OrganizationRead:
    return OrganizationRead(id=row.id, name=row.name, created_at=rfc3339(row.created_at))


def team_read(row: Team) -> TeamRead:
    return TeamRead(
        id=row.id,
        organization_id=row.organization_id,
        name=row.name,
        limits=msgspec.convert(row.limits, RateLimits),
        created_at=rfc3339(row.created_at),
    )


def project_read(row: Project) -> ProjectRead:
    return ProjectRead(
        id=row.id,
        organization_id=row.organization_id,
        team_id=row.team_id,
        name=row.name,
        created_at=rfc3339(row.created_at),
    )


class OrganizationController(Controller):
    path = "/api/admin/organizations"
    tags = ["organizations"]

    @post("/", opt={UNBOUND_ONLY: True})
    async def create(
        self, data: JSONBody[OrganizationCreate], vk: Vk, request: Request[Any, Any, Any]
    ) -> OrganizationRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.create_organization(tx, name=data.name)
        return organization_read(row)

    @get("/")
    async def list_all(
        self, vk: Vk, limit: FromQuery[int | None] = None, cursor: FromQuery[str | None] = None
    ) -> Page[OrganizationRead]:
        async with vk.read() as tx:
            rows, next_cursor = await page(
                tx, select(Organization), Organization.id, limit=limit, cursor=cursor
            )
        return Page([organization_read(r) for r in rows], next_cursor)

    @get("/{organization_id:str}")
    async def get_one(self, organization_id: FromPath[str], vk: Vk) -> OrganizationRead:
        async with vk.read() as tx:
            row = await tx.get(Organization, organization_id, "organization")
        return organization_read(row)


class TeamController(Controller):
    path = "/api/admin/teams"
    tags = ["teams"]

    @post("/")
    async def create(
        self, data: JSONBody[TeamCreate], vk: Vk, request: Request[Any, Any, Any]
    ) -> TeamRead:
        check_limits_are_integers(await request.json())
        async with vk.write(actor_id(request)) as tx:
            row = await service.create_team(
                tx, organization_id=data.organization_id, name=data.name, limits=data.limits
            )
        return team_read(row)

    @patch("/{team_id:str}")
    async def update(
        self,
        team_id: FromPath[str],
        data: JSONBody[TeamUpdate],
        vk: Vk,
        request: Request[Any, Any, Any],
    ) -> TeamRead:
        check_limits_are_integers(await request.json())
        async with vk.write(actor_id(request)) as tx:
            row = await service.update_team(tx, team_id=team_id, data=data)
        return team_read(row)

    @get("/")
    async def list_all(
        self,
        vk: Vk,
        organization_id: FromQuery[str | None] = None,
        limit: FromQuery[int | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> Page[TeamRead]:
        query = filtered(select(Team), {Team.organization_id: organization_id})
        async with vk.read() as tx:
            rows, next_cursor = await page(tx, query, Team.id, limit=limit, cursor=cursor)
        return Page([team_read(r) for r in rows], next_cursor)

    @get("/{team_id:str}")
    async def get_one(self, team_id: FromPath[str], vk: Vk) -> TeamRead:
        async with vk.read() as tx:
            row = await tx.get(Team, team_id, "team")
        return team_read(row)


class ProjectController(Controller):
    path = "/api/admin/projects"
    tags = ["projects"]

    @post("/")
    async def create(
        self, data: JSONBody[ProjectCreate], vk: Vk, request: Request[Any, Any, Any]
    ) -> ProjectRead:
        async with vk.write(actor_id(request)) as tx:
            row = await service.create_project(
                tx, organization_id=data.organization_id, name=data.name, team_id=data.team_id
            )
        return project_read(row)

    @get("/")
    async def list_all(
        self,
        vk: Vk,
        organization_id: FromQuery[str | None] = None,
        team_id: FromQuery[str | None] = None,
        limit: FromQuery[int | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> Page[ProjectRead]:
        query = filtered(
            select(Project), {Project.organization_id: organization_id, Project.team_id: team_id}
        )
        async with vk.read() as tx:
            rows, next_cursor = await page(tx, query, Project.id, limit=limit, cursor=cursor)
        return Page([project_read(r) for r in rows], next_cursor)

    @get("/{project_id:str}")
    async def get_one(self, project_id: FromPath[str], vk: Vk) -> ProjectRead:
        async with vk.read() as tx:
            row = await tx.get(Project, project_id, "project")
        return project_read(row)
