"""`vkgate keys …`: issue, rotate, revoke, disable and enable virtual keys."""

from __future__ import annotations

import secrets
from typing import Any

import click

from vkgate.cli._context import add_resource_commands, admin_client, parse_pairs
from vkgate.cli._limits import limit_options, limits_of
from vkgate.cli._output import json_option, show

KEY_COLUMNS = ("id", "name", "prefix", "project_id", "routing_policy_id", "status", "expires_at")


def _limits(rpm: int | None, tpm: int | None, rpd: int | None, conc: int | None) -> dict[str, int]:
    return limits_of({"rpm": rpm, "tpm": tpm, "rpd": rpd, "max_concurrency": conc})


def _limit_options(function: Any) -> Any:
    """The rate limits, and the rest of what a key may be created or updated with."""
    function = limit_options(function)
    for option in reversed(
        [
            click.option("--allow", "allowed", multiple=True, help="Allowed alias (repeat)."),
            click.option("--expires-at", help="RFC 3339 time the key stops working."),
            click.option("--meta", "metadata", multiple=True, help="Metadata KEY=VALUE."),
        ]
    ):
        function = option(function)
    return function


def _show_secret(row: dict[str, Any], as_json: bool) -> None:
    if as_json:
        show(row, KEY_COLUMNS, as_json=True)
        return
    shown = {k: v for k, v in row.items() if k != "key" and v is not None}
    show(shown, KEY_COLUMNS, as_json=False)
    click.echo("")
    click.echo(f"key: {row['key']}")
    click.echo("This is the only time the key is shown; store it now.")


@click.group("keys")
def keys() -> None:
    """Virtual keys (vk-…)."""


@keys.command("create")
@click.option("--project", "project_id", required=True, help="Project id.")
@click.option("--policy", "policy_id", required=True, help="Routing policy id.")
@click.option("--name", help="Key name (unique in the project); generated when left out.")
@_limit_options
@json_option
def key_create(
    project_id: str,
    policy_id: str,
    name: str | None,
    rpm: int | None,
    tpm: int | None,
    rpd: int | None,
    max_concurrency: int | None,
    allowed: tuple[str, ...],
    expires_at: str | None,
    metadata: tuple[str, ...],
    as_json: bool,
) -> None:
    body: dict[str, Any] = {
        "project_id": project_id,
        "routing_policy_id": policy_id,
        "name": name or f"key-{secrets.token_hex(3)}",
    }
    limits = _limits(rpm, tpm, rpd, max_concurrency)
    if limits:
        body["limits"] = limits
    if allowed:
        body["allowed_models"] = list(allowed)
    if expires_at:
        body["expires_at"] = expires_at
    if metadata:
        body["metadata"] = parse_pairs(metadata, "--meta")
    _show_secret(admin_client().post("/api/admin/virtual-keys", body), as_json)


@keys.command("update")
@click.argument("vk_id")
@click.option("--name")
@click.option("--policy", "policy_id", help="Routing policy id.")
@_limit_options
@click.option("--clear-allowed", is_flag=True, help="Allow every alias of the policy.")
@click.option("--clear-expiry", is_flag=True, help="Remove the expiry.")
@json_option
def key_update(
    vk_id: str,
    name: str | None,
    policy_id: str | None,
    rpm: int | None,
    tpm: int | None,
    rpd: int | None,
    max_concurrency: int | None,
    allowed: tuple[str, ...],
    expires_at: str | None,
    metadata: tuple[str, ...],
    clear_allowed: bool,
    clear_expiry: bool,
    as_json: bool,
) -> None:
    body: dict[str, Any] = {}
    if name:
        body["name"] = name
    if policy_id:
        body["routing_policy_id"] = policy_id
    limits = _limits(rpm, tpm, rpd, max_concurrency)
    if limits:
        body["limits"] = limits  # replaces every limit of the key
    if allowed or clear_allowed:
        body["allowed_models"] = list(allowed) if allowed else None
    if expires_at or clear_expiry:
        body["expires_at"] = expires_at
    if metadata:
        body["metadata"] = parse_pairs(metadata, "--meta")
    if not body:
        raise click.UsageError("nothing to change: give at least one option")
    show(
        admin_client().patch(f"/api/admin/virtual-keys/{vk_id}", body), KEY_COLUMNS, as_json=as_json
    )


@keys.command("list")
@click.option("--org", "org_id", help="Only this organization's keys.")
@click.option("--project", "project_id", help="Only this project's keys.")
@click.option("--status", type=click.Choice(["active", "disabled", "revoked"]))
@json_option
def key_list(org_id: str | None, project_id: str | None, status: str | None, as_json: bool) -> None:
    rows = admin_client().list_all(
        "/api/admin/virtual-keys", organization_id=org_id, project_id=project_id, status=status
    )
    show(list(rows), KEY_COLUMNS, as_json=as_json)


@keys.command("rotate")
@click.argument("vk_id")
@click.option(
    "--grace-seconds",
    type=click.IntRange(min=0),
    default=86400,
    show_default=True,
    help="How long the current key keeps working; 0 stops it at once.",
)
@json_option
def key_rotate(vk_id: str, grace_seconds: int, as_json: bool) -> None:
    body = {"grace_seconds": grace_seconds}
    row = admin_client().post(f"/api/admin/virtual-keys/{vk_id}/rotate", body)
    _show_secret(row, as_json)
    if not as_json:
        click.echo(f"The previous key works until {row['previous_key_valid_until']}.")


def _transition(verb: str) -> click.Command:
    @click.argument("vk_id")
    @json_option
    def command(vk_id: str, as_json: bool) -> None:
        row = admin_client().post(f"/api/admin/virtual-keys/{vk_id}/{verb}")
        show(row, KEY_COLUMNS, as_json=as_json)

    helps = {
        "revoke": "Revoke a key for good (it cannot be enabled again).",
        "disable": "Disable a key until it is enabled again.",
        "enable": "Enable a disabled key.",
    }
    return click.command(verb, help=helps[verb])(command)


for _verb in ("revoke", "disable", "enable"):
    keys.add_command(_transition(_verb))


add_resource_commands(
    keys, "/api/admin/virtual-keys", KEY_COLUMNS, what="virtual key", listing="own"
)
