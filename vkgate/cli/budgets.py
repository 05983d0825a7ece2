"""`vkgate budgets|tokens|audit …`: spend limits, admin tokens and the audit log."""

from __future__ import annotations

from typing import Any

import click

from vkgate.cli._context import add_resource_commands, admin_client
from vkgate.cli._output import json_option, show

BUDGET_COLUMNS = ("id", "name", "scope", "window", "limit_usd", "provider_id", "on_breach")
TOKEN_COLUMNS = ("id", "name", "role", "prefix", "created_at", "revoked_at")
AUDIT_COLUMNS = ("id", "at", "actor", "action", "resource_id", "details")
SCOPES = ("organization", "team", "project", "virtual_key", "end_user")


def _scope(text: str) -> dict[str, str | None]:
    kind, _, ident = text.partition(":")
    if kind not in SCOPES:
        raise click.BadParameter(
            f"expected KIND[:ID] with KIND one of {', '.join(SCOPES)}, got {text!r}",
            param_hint="--scope",
        )
    return {"kind": kind, "id": ident or None}


@click.group("budgets")
def budgets() -> None:
    """Spend budgets by scope and window."""


@budgets.command("create")
@click.option("--org", "org_id", required=True, help="Organization id.")
@click.option(
    "--scope",
    required=True,
    help="KIND[:ID]: organization, team:ID, project:ID, virtual_key:ID, end_user:ID, or "
    "end_user alone for a budget of each end user.",
)
@click.option("--window", required=True, type=click.Choice(["day", "week", "month", "total"]))
@click.option("--limit-usd", required=True, help="Limit in USD, more than 0, e.g. 250 or 12.50.")
@click.option("--name")
@click.option("--provider", "provider_id", help="Count only this provider's spend.")
@click.option(
    "--on-breach", type=click.Choice(["block", "warn"]), default="block", show_default=True
)
@json_option
def budget_create(
    org_id: str,
    scope: str,
    window: str,
    limit_usd: str,
    name: str | None,
    provider_id: str | None,
    on_breach: str,
    as_json: bool,
) -> None:
    body: dict[str, Any] = {
        "organization_id": org_id,
        "scope": _scope(scope),
        "window": window,
        "limit_usd": limit_usd,
        "on_breach": on_breach,
    }
    if name:
        body["name"] = name
    if provider_id:
        body["provider_id"] = provider_id
    show(admin_client().post("/api/admin/budgets", body), BUDGET_COLUMNS, as_json=as_json)


@budgets.command("update")
@click.argument("budget_id")
@click.option("--name")
@click.option("--clear-name", is_flag=True, help="Remove the name.")
@click.option("--window", type=click.Choice(["day", "week", "month", "total"]))
@click.option("--limit-usd", help="Limit in USD, more than 0.")
@click.option("--provider", "provider_id", help="Count only this provider's spend.")
@click.option("--all-providers", is_flag=True, help="Count every provider's spend again.")
@click.option("--on-breach", type=click.Choice(["block", "warn"]))
@json_option
def budget_update(
    budget_id: str,
    name: str | None,
    clear_name: bool,
    window: str | None,
    limit_usd: str | None,
    provider_id: str | None,
    all_providers: bool,
    on_breach: str | None,
    as_json: bool,
) -> None:
    """Change a budget; its organization and scope never change (delete and create instead)."""
    if name and clear_name:
        raise click.UsageError("give --name or --clear-name, not both")
    if provider_id and all_providers:
        raise click.UsageError("give --provider or --all-providers, not both")
    given = {
        "name": name,
        "window": window,
        "limit_usd": limit_usd,
        "provider_id": provider_id,
        "on_breach": on_breach,
    }
    body: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    # null clears these two on the API; an option left out leaves them alone.
    if clear_name:
        body["name"] = None
    if all_providers:
        body["provider_id"] = None
    if not body:
        raise click.UsageError("nothing to change: give at least one option")
    row = admin_client().patch(f"/api/admin/budgets/{budget_id}", body)
    show(row, BUDGET_COLUMNS, as_json=as_json)


@click.group("tokens")
def tokens() -> None:
    """Admin tokens (roles: admin, finance; optionally bound to one organization)."""


@tokens.command("create")
@click.option("--name", required=True)
@click.option("--role", required=True, type=click.Choice(["admin", "finance"]))
@click.option(
    "--org",
    "org_id",
    help="Bind the token to this organization: it sees and changes only that organization's "
    "resources, and cannot create organizations or manage tokens.",
)
@json_option
def token_create(name: str, role: str, org_id: str | None, as_json: bool) -> None:
    body = {"name": name, "role": role}
    if org_id is not None:
        body["organization_id"] = org_id
    row = admin_client().post("/api/admin/tokens", body)
    show(
        row if as_json else {k: v for k, v in row.items() if k != "token"},
        TOKEN_COLUMNS,
        as_json=as_json,
    )
    if not as_json:
        click.echo(f"\ntoken: {row['token']}\nThis is the only time the token is shown.")


@tokens.command("list")
@json_option
def token_list(as_json: bool) -> None:
    show(list(admin_client().list_all("/api/admin/tokens")), TOKEN_COLUMNS, as_json=as_json)


@tokens.command("revoke")
@click.argument("token_id")
@json_option
def token_revoke(token_id: str, as_json: bool) -> None:
    show(
        admin_client().post(f"/api/admin/tokens/{token_id}/revoke"), TOKEN_COLUMNS, as_json=as_json
    )


@click.command("audit")
@click.option("--org", "org_id", help="Only this organization's entries.")
@click.option("--resource", "resource_id", help="Only entries about this resource id.")
@json_option
def audit(org_id: str | None, resource_id: str | None, as_json: bool) -> None:
    """The audit log of admin changes, oldest first."""
    rows = admin_client().list_all(
        "/api/admin/audit-log", organization_id=org_id, resource_id=resource_id
    )
    show(list(rows), AUDIT_COLUMNS, as_json=as_json)


add_resource_commands(
    budgets, "/api/admin/budgets", BUDGET_COLUMNS, what="budget", delete_verb="delete"
)
