"""`vkgate guardrails …`: checks on the text of requests and answers."""

from __future__ import annotations

import json
from typing import Any

import click

from vkgate.cli._context import add_resource_commands, admin_client
from vkgate.cli._output import json_option, show
from vkgate.cli.providers import secret_value as secret_from

COLUMNS = ("id", "name", "kind", "scope", "stage", "action", "on_error", "timeout_ms", "enabled")
SCOPES = ("organization", "team", "project", "virtual_key")
KINDS = ("regex", "pii", "secrets", "webhook", "moderation")
STAGES = ("request", "response", "both")
ACTIONS = ("block", "redact", "warn")


def _scope(text: str) -> dict[str, str | None]:
    kind, _, ident = text.partition(":")
    if kind not in SCOPES:
        raise click.BadParameter(
            f"expected KIND[:ID] with KIND one of {', '.join(SCOPES)}, got {text!r}",
            param_hint="--scope",
        )
    return {"kind": kind, "id": ident or None}


def _config(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--config") from None
    if not isinstance(config, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--config")
    return config


@click.group("guardrails")
def guardrails() -> None:
    """Guardrails: regex, pii, secrets, webhook and moderation checks on text."""


@guardrails.command("create")
@click.option("--org", "org_id", required=True, help="Organization id.")
@click.option("--name", required=True)
@click.option("--kind", required=True, type=click.Choice(KINDS))
@click.option(
    "--scope",
    default="organization",
    show_default=True,
    help="KIND[:ID]: organization, team:ID, project:ID or virtual_key:ID.",
)
@click.option("--stage", type=click.Choice(STAGES), default="both", show_default=True)
@click.option("--action", type=click.Choice(ACTIONS), default="block", show_default=True)
@click.option(
    "--on-error", type=click.Choice(["allow", "block"]), default="allow", show_default=True
)
@click.option("--timeout-ms", type=int, default=1000, show_default=True)
@click.option(
    "--config", "config_text", help='The kind\'s config as JSON, e.g. \'{"entities": ["email"]}\'.'
)
@click.option("--secret", help="A webhook's signing secret; `-` reads it from standard input.")
@click.option("--secret-env", help="Read the webhook's secret from this variable.")
@click.option("--disabled", is_flag=True, help="Create it switched off.")
@json_option
def create(
    org_id: str,
    name: str,
    kind: str,
    scope: str,
    stage: str,
    action: str,
    on_error: str,
    timeout_ms: int,
    config_text: str | None,
    secret: str | None,
    secret_env: str | None,
    disabled: bool,
    as_json: bool,
) -> None:
    body: dict[str, Any] = {
        "organization_id": org_id,
        "name": name,
        "kind": kind,
        "scope": _scope(scope),
        "stage": stage,
        "action": action,
        "on_error": on_error,
        "timeout_ms": timeout_ms,
        "enabled": not disabled,
    }
    config = _config(config_text)
    if config is not None:
        body["config"] = config
    sealed = secret_from(secret, secret_env, "secret")
    if sealed is not None:
        body["secret"] = sealed
    show(admin_client().post("/api/admin/guardrails", body), COLUMNS, as_json=as_json)


@guardrails.command("update")
@click.argument("guardrail_id")
@click.option("--name")
@click.option("--stage", type=click.Choice(STAGES))
@click.option("--action", type=click.Choice(ACTIONS))
@click.option("--on-error", type=click.Choice(["allow", "block"]))
@click.option("--timeout-ms", type=int)
@click.option("--config", "config_text", help="The kind's config as JSON (replaces it).")
@click.option("--secret", help="A new signing secret; `-` reads it from standard input.")
@click.option("--secret-env", help="Read the new secret from this variable.")
@click.option("--enable/--disable", "enabled", default=None)
@json_option
def update(
    guardrail_id: str,
    name: str | None,
    stage: str | None,
    action: str | None,
    on_error: str | None,
    timeout_ms: int | None,
    config_text: str | None,
    secret: str | None,
    secret_env: str | None,
    enabled: bool | None,
    as_json: bool,
) -> None:
    """Change a guardrail; its organization, scope and kind never change."""
    given = {
        "name": name,
        "stage": stage,
        "action": action,
        "on_error": on_error,
        "timeout_ms": timeout_ms,
        "config": _config(config_text),
        "secret": secret_from(secret, secret_env, "secret"),
        "enabled": enabled,
    }
    body = {k: v for k, v in given.items() if v is not None}
    if not body:
        raise click.UsageError("nothing to change: give at least one option")
    show(
        admin_client().patch(f"/api/admin/guardrails/{guardrail_id}", body),
        COLUMNS,
        as_json=as_json,
    )


add_resource_commands(
    guardrails, "/api/admin/guardrails", COLUMNS, what="guardrail", delete_verb="delete"
)
