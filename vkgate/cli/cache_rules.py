"""`vkgate cache-rules …`: which keys' requests for which models the response cache answers."""

from __future__ import annotations

from typing import Any

import click

from vkgate.cli._context import add_resource_commands, admin_client
from vkgate.cli._output import json_option, show

CACHE_RULE_COLUMNS = ("id", "name", "scope", "models", "ttl_seconds", "enabled")
SCOPES = ("organization", "team", "project", "virtual_key")


def _scope(text: str) -> dict[str, str | None]:
    kind, _, ident = text.partition(":")
    if kind not in SCOPES:
        raise click.BadParameter(
            f"expected KIND[:ID] with KIND one of {', '.join(SCOPES)}, got {text!r}",
            param_hint="--scope",
        )
    return {"kind": kind, "id": ident or None}


def _models(values: tuple[str, ...]) -> list[str]:
    """`--model` given once per glob, or as a comma list."""
    return [m.strip() for value in values for m in value.split(",") if m.strip()]


@click.group("cache-rules")
def cache_rules() -> None:
    """Response-cache rules: repeated requests answered without a provider call."""


@cache_rules.command("create")
@click.option("--org", "org_id", required=True, help="Organization id.")
@click.option("--name", required=True)
@click.option(
    "--scope",
    default="organization",
    show_default=True,
    help="KIND[:ID]: organization, team:ID, project:ID or virtual_key:ID. An entry is never "
    "served outside the scope that stored it.",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    required=True,
    help="Alias glob to cache (repeat, or a comma list): gpt-4o*, *.",
)
@click.option(
    "--ttl",
    "ttl_seconds",
    required=True,
    type=click.IntRange(min=1),
    help="How long an answer is served from the cache, in seconds.",
)
@click.option("--disabled", is_flag=True, help="Create the rule switched off.")
@json_option
def cache_rule_create(
    org_id: str,
    name: str,
    scope: str,
    models: tuple[str, ...],
    ttl_seconds: int,
    disabled: bool,
    as_json: bool,
) -> None:
    body: dict[str, Any] = {
        "organization_id": org_id,
        "name": name,
        "scope": _scope(scope),
        "models": _models(models),
        "ttl_seconds": ttl_seconds,
        "enabled": not disabled,
    }
    show(admin_client().post("/api/admin/cache-rules", body), CACHE_RULE_COLUMNS, as_json=as_json)


@cache_rules.command("update")
@click.argument("rule_id")
@click.option("--name")
@click.option("--model", "models", multiple=True, help="Replaces the rule's alias globs.")
@click.option("--ttl", "ttl_seconds", type=click.IntRange(min=1), help="Seconds.")
@click.option("--enable/--disable", "enabled", default=None, help="Switch the rule on or off.")
@json_option
def cache_rule_update(
    rule_id: str,
    name: str | None,
    models: tuple[str, ...],
    ttl_seconds: int | None,
    enabled: bool | None,
    as_json: bool,
) -> None:
    """Change a rule; its organization and scope never change (delete and create instead)."""
    given = {
        "name": name,
        "models": _models(models) or None,
        "ttl_seconds": ttl_seconds,
        "enabled": enabled,
    }
    body = {k: v for k, v in given.items() if v is not None}
    if not body:
        raise click.UsageError("nothing to change: give at least one option")
    row = admin_client().patch(f"/api/admin/cache-rules/{rule_id}", body)
    show(row, CACHE_RULE_COLUMNS, as_json=as_json)


add_resource_commands(
    cache_rules,
    "/api/admin/cache-rules",
    CACHE_RULE_COLUMNS,
    what="cache rule",
    delete_verb="delete",
)
