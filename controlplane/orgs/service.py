"""Creating and changing organizations, teams and projects."""

from __future__ import annotations

from typing import Any

import msgspec
from sqlalchemy import select

from controlplane.errors import conflict, invalid
from controlplane.keys.service import KeyStatus
from controlplane.models import Organization, Project, Team, VirtualKey
from controlplane.orgs.schemas import TeamUpdate
from controlplane.schemas import RateLimits
from controlplane.security import new_id
from controlplane.state import Tx
from vkgate.wire import EventKind


async def create_organization(tx: Tx, *, name: str) -> Organization:
    if await tx.session.scalar(select(Organization.id).where(Organization.name == name)):
        raise conflict(f"an organization named {name!r} already exists", param="name")
    org = Organization(id=new_id("org"), name=name, created_at=tx.clock.now())
    tx.session.add(org)
    await tx.audit("organization.create", "organization", org.id, org.id, {"name": name})
    return org


async def _check_team_name_free(
    tx: Tx, organization_id: str, name: str, *, other_than: str = ""
) -> None:
    taken = await tx.session.scalar(
        select(Team.id).where(
            Team.organization_id == organization_id, Team.name == name, Team.id != other_than
        )
    )
    if taken:
        raise conflict(f"a team named {name!r} already exists in this organization", param="name")


def _stored_limits(limits: RateLimits | None) -> dict[str, Any]:
    return msgspec.to_builtins(limits) if limits else {}


async def create_team(
    tx: Tx, *, organization_id: str, name: str, limits: RateLimits | None = None
) -> Team:
    await tx.get(Organization, organization_id, "organization", param="organization_id")
    await _check_team_name_free(tx, organization_id, name)
    team = Team(
        id=new_id("team"),
        organization_id=organization_id,
        name=name,
        limits=_stored_limits(limits),
        created_at=tx.clock.now(),
    )
    tx.session.add(team)
    await tx.audit(
        "team.create", "team", team.id, organization_id, {"name": name, "limits": team.limits}
    )
    return team


async def update_team(tx: Tx, *, team_id: str, data: TeamUpdate) -> Team:
    """Apply the fields given; a PATCH that changes nothing records nothing and wakes no proxy.

    A change of limits is a change of every bundle of the team's keys (they carry the team's
    limits), so each of those keys gets its VK_CONFIG_UPDATED in this same transaction.
    """
    team = await tx.get(Team, team_id, "team")
    wanted: dict[str, Any] = {
        "name": team.name if data.name is msgspec.UNSET else data.name,
        "limits": team.limits if data.limits is msgspec.UNSET else _stored_limits(data.limits),
    }
    changed = [field for field, value in wanted.items() if value != getattr(team, field)]
    if not changed:
        return team
    if "name" in changed:
        await _check_team_name_free(tx, team.organization_id, wanted["name"], other_than=team.id)
    for field in changed:
        setattr(team, field, wanted[field])
    await tx.audit(
        "team.update",
        "team",
        team.id,
        team.organization_id,
        {"fields": changed, "limits": team.limits} if "limits" in changed else {"fields": changed},
    )
    if "limits" in changed:
        await _announce_to_keys(tx, team)
    return team


async def _announce_to_keys(tx: Tx, team: Team) -> None:
    """VK_CONFIG_UPDATED for every usable key of the team's projects (a revoked key has no
    bundle to refresh); each key's revision becomes its event's, as a key's own change does."""
    keys = await tx.session.scalars(
        select(VirtualKey)
        .join(Project, Project.id == VirtualKey.project_id)
        .where(Project.team_id == team.id, VirtualKey.status != KeyStatus.REVOKED.value)
        .order_by(VirtualKey.id)
    )
    for key in list(keys):
        key.revision = await tx.event(
            EventKind.VK_CONFIG_UPDATED,
            organization_id=key.organization_id,
            entity_kind="virtual_key",
            entity_id=key.id,
            vk_id=key.id,
        )


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
