"""`vkgate providers|policies …`: upstream endpoints and the aliases that route to them."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from vkgate import env as E
from vkgate.cli._context import add_resource_commands, admin_client, parse_pairs
from vkgate.cli._output import json_option, show

PROVIDER_COLUMNS = (
    "id",
    "organization_id",
    "name",
    "kind",
    "base_url",
    "has_api_key",
    "responses_api",
)
POLICY_COLUMNS = ("id", "organization_id", "name", "aliases")
KINDS = ("openai", "azure_openai", "anthropic", "openai_compatible", "mock")


def _api_key(api_key: str | None, api_key_env: str | None) -> str | None:
    """From --api-key (`-` reads stdin, keeping it out of shell history) or --api-key-env."""
    if api_key is not None and api_key_env is not None:
        raise click.UsageError("give --api-key or --api-key-env, not both")
    if api_key == "-":
        return sys.stdin.readline().strip() or None
    if api_key_env is not None:
        value = E.environment().get(api_key_env)
        if not value:
            raise click.BadParameter(f"{api_key_env} is not set", param_hint="--api-key-env")
        return value
    return api_key


def _prices(values: tuple[str, ...]) -> dict[str, dict[str, str]] | None:
    """`MODEL=INPUT,OUTPUT[,CACHE_READ[,CACHE_WRITE]]`, USD per million tokens."""
    if not values:
        return None
    names = ("input_per_mtok", "output_per_mtok", "cache_read_per_mtok", "cache_write_per_mtok")
    prices: dict[str, dict[str, str]] = {}
    for model, numbers in parse_pairs(values, "--price").items():
        parts = [p.strip() for p in numbers.split(",")]
        if not 2 <= len(parts) <= 4:
            raise click.BadParameter(
                f"expected MODEL=INPUT,OUTPUT[,CACHE_READ[,CACHE_WRITE]], got {model}={numbers}",
                param_hint="--price",
            )
        prices[model] = dict(zip(names, parts, strict=False))
    return prices


def _provider_options(function: Any) -> Any:
    for option in reversed(
        [
            click.option("--base-url", help="What the provider's own SDK takes as base URL."),
            click.option("--api-key", help="The credential; `-` reads it from standard input."),
            click.option("--api-key-env", help="Read the credential from this variable."),
            click.option("--api-version", help="Azure OpenAI API version."),
            click.option("--header", "headers", multiple=True, help="Extra header NAME=VALUE."),
            click.option("--price", "prices", multiple=True, help="MODEL=IN,OUT[,CR,CW] USD/Mtok."),
            click.option(
                "--responses-api/--no-responses-api",
                "responses_api",
                default=None,
                help="Whether an OpenAI-format provider serves the Responses API itself "
                "(the default); --no-responses-api has the proxy translate it to chat.",
            ),
        ]
    ):
        function = option(function)
    return function


@click.group("providers")
def providers() -> None:
    """Model providers and their credentials (stored encrypted, never shown again)."""


@providers.command("add")
@click.option("--org", "org_id", required=True, help="Organization id.")
@click.option("--name", required=True)
@click.option("--kind", required=True, type=click.Choice(KINDS))
@_provider_options
@json_option
def provider_add(
    org_id: str,
    name: str,
    kind: str,
    base_url: str | None,
    api_key: str | None,
    api_key_env: str | None,
    api_version: str | None,
    headers: tuple[str, ...],
    prices: tuple[str, ...],
    responses_api: bool | None,
    as_json: bool,
) -> None:
    body: dict[str, Any] = {"organization_id": org_id, "name": name, "kind": kind}
    optional = {
        "base_url": base_url,
        "api_key": _api_key(api_key, api_key_env),
        "api_version": api_version,
        "headers": parse_pairs(headers, "--header") or None,
        "price_overrides": _prices(prices),
        "responses_api": responses_api,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    show(admin_client().post("/api/admin/providers", body), PROVIDER_COLUMNS, as_json=as_json)


@providers.command("update")
@click.argument("provider_id")
@click.option("--name")
@_provider_options
@json_option
def provider_update(
    provider_id: str,
    name: str | None,
    base_url: str | None,
    api_key: str | None,
    api_key_env: str | None,
    api_version: str | None,
    headers: tuple[str, ...],
    prices: tuple[str, ...],
    responses_api: bool | None,
    as_json: bool,
) -> None:
    changes = {
        "name": name,
        "base_url": base_url,
        "api_key": _api_key(api_key, api_key_env),
        "api_version": api_version,
        "headers": parse_pairs(headers, "--header") or None,
        "price_overrides": _prices(prices),
        "responses_api": responses_api,
    }
    body = {k: v for k, v in changes.items() if v is not None}
    if not body:
        raise click.UsageError("nothing to change: give at least one option")
    row = admin_client().patch(f"/api/admin/providers/{provider_id}", body)
    show(row, PROVIDER_COLUMNS, as_json=as_json)


def _aliases(values: tuple[str, ...], file: str | None) -> dict[str, list[dict[str, str]]] | None:
    """`ALIAS=PROVIDER_ID:MODEL[,PROVIDER_ID:MODEL…]` (a fallback chain, in order), or a file."""
    if file is not None:
        with open(file) as handle:
            loaded: dict[str, list[dict[str, str]]] = json.load(handle)
        return loaded
    if not values:
        return None
    aliases: dict[str, list[dict[str, str]]] = {}
    for alias, chain in parse_pairs(values, "--alias").items():
        steps = []
        for step in chain.split(","):
            provider_id, sep, model = step.strip().partition(":")
            if not sep or not provider_id or not model:
                raise click.BadParameter(
                    f"expected ALIAS=PROVIDER_ID:MODEL[,…], got {alias}={chain}",
                    param_hint="--alias",
                )
            steps.append({"provider_id": provider_id, "model": model})
        aliases[alias] = steps
    return aliases


@click.group("policies")
def policies() -> None:
    """Routing policies: model aliases and their fallback chains."""


@policies.command("create")
@click.option("--org", "org_id", required=True, help="Organization id.")
@click.option("--name", required=True)
@click.option(
    "--alias", "aliases", multiple=True, help="ALIAS=PROVIDER_ID:MODEL[,PROVIDER_ID:MODEL…]"
)
@click.option("--file", "aliases_file", type=click.Path(exists=True), help="Aliases as JSON.")
@json_option
def policy_create(
    org_id: str, name: str, aliases: tuple[str, ...], aliases_file: str | None, as_json: bool
) -> None:
    chains = _aliases(aliases, aliases_file)
    if chains is None:
        raise click.UsageError("give at least one --alias (or --file)")
    body = {"organization_id": org_id, "name": name, "aliases": chains}
    show(admin_client().post("/api/admin/routing-policies", body), POLICY_COLUMNS, as_json=as_json)


@policies.command("update")
@click.argument("policy_id")
@click.option("--name")
@click.option("--alias", "aliases", multiple=True, help="Replaces every alias of the policy.")
@click.option("--file", "aliases_file", type=click.Path(exists=True), help="Aliases as JSON.")
@json_option
def policy_update(
    policy_id: str,
    name: str | None,
    aliases: tuple[str, ...],
    aliases_file: str | None,
    as_json: bool,
) -> None:
    body: dict[str, Any] = {}
    if name is not None:
        body["name"] = name
    chains = _aliases(aliases, aliases_file)
    if chains is not None:
        body["aliases"] = chains
    if not body:
        raise click.UsageError("nothing to change: give --name, --alias or --file")
    row = admin_client().patch(f"/api/admin/routing-policies/{policy_id}", body)
    show(row, POLICY_COLUMNS, as_json=as_json)


add_resource_commands(
    providers, "/api/admin/providers", PROVIDER_COLUMNS, what="provider", delete_verb="remove"
)
add_resource_commands(
    policies,
    "/api/admin/routing-policies",
    POLICY_COLUMNS,
    what="routing policy",
    delete_verb="delete",
)
