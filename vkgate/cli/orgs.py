"""`vkgate orgs|teams|projects …`: who owns keys and spend."""

from __future__ import annotations

from typing import Any

import click

from vkgate.cli._context import add_resource_commands, admin_client
from vkgate.cli._limits import limit_options, limits_of
from vkgate.cli._output import json_option, show

ORG_COLUMNS = ("id", "name", "created_at")
TEAM_COLUMNS = ("id", "organization_id", "name", "limits", "created_at")
PROJECT_COLUMNS = ("id", "organization_id", "team_id", "name", "created_at")


@click.group("orgs")
def orgs() -> None:
    """Organizations."""


@orgs.command("create")
@click.argument("name")
@json_option
def org_create(name: str, as_json: bool) -> None:
    show(
        admin_client().post("/api/admin/organizations", {"name": name}),
        ORG_COLUMNS,
        as_json=as_json,
    )


@click.group("teams")
def teams() -> None:
    """Teams of an organization."""


@teams.command("create")
@click.option("--org", "org_id", required=True, help="Organization id.")
@click.argument("name")
@limit_options
@json_option
def team_create(org_id: str, name: str, as_json: bool, **limits: int | None) -> None:
    """Create a team; its limits are shared by every key of its projects."""
    body: dict[str, Any] = {"organization_id": org_id, "name": name}
    if given := limits_of(limits):
        body["limits"] = given
    show(admin_client().post("/api/admin/teams", body), TEAM_COLUMNS, as_json=as_json)


@teams.command("update")
@click.argument("team_id")
@click.option("--name", help="New name (unique in the organization).")
@limit_options
@click.option("--clear-limits", is_flag=True, help="Remove every limit of the team.")
@json_option
def team_update(
    team_id: str, name: str | None, clear_limits: bool, as_json: bool, **limits: int | None
) -> None:
    """Rename a team or set its limits; the limits given replace all of the team's limits."""
    given = limits_of(limits)
    if given and clear_limits:
        raise click.UsageError("--clear-limits removes every limit: give it without limits")
    body: dict[str, Any] = {}
    if name:
        body["name"] = name
    if given or clear_limits:
        body["limits"] = given or None
    if not body:
        raise click.UsageError("nothing to change: give at least one option")
    show(admin_client().patch(f"/api/admin/teams/{team_id}", body), TEAM_COLUMNS, as_json=as_json)


@click.group("projects")
def projects() -> None:
    """Projects: the unit virtual keys belong to."""


@projects.command("create")
@click.option("--org", "org_id", required=True, help="Organization id.")
@click.option("--team", "team_id", help="Team id (optional).")
@click.argument("name")
@json_option
def project_create(org_id: str, team_id: str | None, name: str, as_json: bool) -> None:
    body = {"organization_id": org_id, "name": name, "team_id": team_id}
    show(admin_client().post("/api/admin/projects", body), PROJECT_COLUMNS, as_json=as_json)


@projects.command("list")
@click.option("--org", "org_id", help="Only this organization's projects.")
@click.option("--team", "team_id", help="Only this team's projects.")
@json_option
def project_list(org_id: str | None, team_id: str | None, as_json: bool) -> None:
    rows = admin_client().list_all("/api/admin/projects", organization_id=org_id, team_id=team_id)
    show(list(rows), PROJECT_COLUMNS, as_json=as_json)


add_resource_commands(
    orgs, "/api/admin/organizations", ORG_COLUMNS, what="organization", listing="all"
)
add_resource_commands(teams, "/api/admin/teams", TEAM_COLUMNS, what="team")
add_resource_commands(
    projects, "/api/admin/projects", PROJECT_COLUMNS, what="project", listing="own"
)
