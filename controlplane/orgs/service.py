"""Creating and reading organizations, teams and projects."""

from __future__ import annotations

from sqlalchemy import select

from controlplane.errors import conflict, invalid
from controlplane.models import Organization, Project, Team
from controlplane.security import new_id
from controlplane.state import Tx


async def create_organization(tx: Tx, *, name: str) -> Organization:
    if await tx.session.scalar(select(Organization.id).where(Organization.name == name)):
        raise conflict(f"an organization named {name!r} already exists", param="name")
    org = Organization(id=new_id("org"), name=name, created_at=tx.clock.now())
    tx.session.add(org)
    await tx.audit("organization.create", "organization", org.id, org.id, {"name": name})
    return org


async def create_team(tx: Tx, *, organization_id: str, name: str) -> Team:
    await tx.get(Organization, organization_id, "organization", param="organization_id")
    taken = await tx.session.scalar(
        select(Team.id).where(Team.organization_id == organization_id, Team.name == name)
    )
    if taken:
        raise conflict(f"a team named {name!r} already exists in this organization", param="name")
    team = Team(
        id=new_id("team"), organization_id=organization_id, name=name, created_at=tx.clock.now()
    )
    tx.session.add(team)
    await tx.audit("team.create", "team", team.id, organization_id, {"name": name})
    return team


async def create_project(
    tx: Tx, *, organization_id: str, name: str, team_id: str | None
) -> Project:
    await tx.get(Organization, organization_id, "organization", param="organization_id")
    if team_id is not None:
        team = await tx.get(Team, team_id, "team", param="team_id")
        if team.organization_id != organization_id:
            raise invalid("team_id belongs to another organization", param="team_id")
    taken = await tx.session.scalar(
        select(Project.id).where(Project.organization_id == organization_id, Project.name == name)
    )
    if taken:
        raise conflict(
            f"a project named {name!r} already exists in this organization", param="name"
        )
    project = Project(
        id=new_id("proj"),
        organization_id=organization_id,
        team_id=team_id,
        name=name,
        created_at=tx.clock.now(),
    )
    tx.session.add(project)
    await tx.audit(
        "project.create", "project", project.id, organization_id, {"name": name, "team_id": team_id}
    )
    return project
