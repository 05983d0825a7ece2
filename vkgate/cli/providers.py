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
KINDS = (
    "openai",
    "azure_openai",
    "anthropic",
    "openai_compatible",
    "mock",
    "bedrock",
    "gemini",
    "vertex_ai",
)


STORED_CREDENTIAL = {"bedrock": "aws_access_key_id", "vertex_ai": "service_account_json"}
"""The field whose `null` forgets a cloud kind's stored credential."""


def secret_value(value: str | None, env_name: str | None, option: str) -> str | None:
    """From --OPTION (`-` reads stdin, keeping it out of shell history) or --OPTION-env."""
    if value is not None and env_name is not None:
        raise click.UsageError(f"give --{option} or --{option}-env, not both")
    if value == "-":
        return sys.stdin.readline().strip() or None
    if env_name is not None:
        found = E.environment().get(env_name)
        if not found:
            raise click.BadParameter(f"{env_name} is not set", param_hint=f"--{option}-env")
        return found
    return value


def _api_key(api_key: str | None, api_key_env: str | None) -> str | None:
    return secret_value(api_key, api_key_env, "api-key")


def _service_account(path: str | None) -> str | None:
    """The JSON key file's text: the control plane checks it (and says what is wrong)."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _cloud_fields(
    region: str | None,
    project: str | None,
    location: str | None,
    aws_access_key_id: str | None,
    aws_secret_access_key: str | None,
    aws_secret_access_key_env: str | None,
    aws_session_token_env: str | None,
    service_account_file: str | None,
) -> dict[str, Any]:
    """The cloud kinds' fields that were given (the control plane refuses a kind's foreign ones)."""
    secret = secret_value(aws_secret_access_key, aws_secret_access_key_env, "aws-secret-access-key")
    token = secret_value(None, aws_session_token_env, "aws-session-token")
    fields = {
        "region": region,
        "project": project,
        "location": location,
        "aws_access_key_id": aws_access_key_id,
        "aws_secret_access_key": secret,
        "aws_session_token": token,
        "service_account_json": _service_account(service_account_file),
    }
    return {name: value for name, value in fields.items() if value is not None}


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


def _base_url(base_url: str | None, endpoint_url: str | None) -> str | None:
    if base_url is not None and endpoint_url is not None:
        raise click.UsageError("give --base-url or --endpoint-url, not both")
    return base_url if base_url is not None else endpoint_url


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
            click.option(
                "--endpoint-url",
                help="bedrock: the runtime endpoint, as boto3's endpoint_url (= --base-url).",
            ),
            click.option("--region", help="bedrock: the AWS region, e.g. us-east-1."),
            click.option("--project", help="vertex_ai: the Google Cloud project."),
            click.option("--location", help="vertex_ai: us-central1, europe-west4, global…"),
            click.option(
                "--aws-access-key-id",
                help="bedrock: stored AWS keys; leave out to use the proxy's own AWS credentials.",
            ),
            click.option(
                "--aws-secret-access-key", help="bedrock: the secret; `-` reads standard input."
            ),
            click.option(
                "--aws-secret-access-key-env", help="bedrock: read the secret from this variable."
            ),
            click.option(
                "--aws-session-token-env", help="bedrock: read a session token from this variable."
            ),
            click.option(
                "--service-account-file",
                type=click.Path(exists=True, dir_okay=False),
                help="vertex_ai: a service account's JSON key; leave out to use the proxy's own "
                "Google credentials.",
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
    **cloud: Any,
) -> None:
    body: dict[str, Any] = {"organization_id": org_id, "name": name, "kind": kind}
    optional = {
        "base_url": _base_url(base_url, cloud.pop("endpoint_url")),
        "api_key": _api_key(api_key, api_key_env),
        "api_version": api_version,
        "headers": parse_pairs(headers, "--header") or None,
        "price_overrides": _prices(prices),
        "responses_api": responses_api,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    body.update(_cloud_fields(**cloud))
    show(admin_client().post("/api/admin/providers", body), PROVIDER_COLUMNS, as_json=as_json)


@providers.command("update")
@click.argument("provider_id")
@click.option("--name")
@click.option(
    "--workload-credentials",
    is_flag=True,
    help="bedrock, vertex_ai: forget the stored keys or service account; the proxy's own "
    "credentials are used.",
)
@_provider_options
@json_option
def provider_update(
    provider_id: str,
    name: str | None,
    workload_credentials: bool,
    base_url: str | None,
    api_key: str | None,
    api_key_env: str | None,
    api_version: str | None,
    headers: tuple[str, ...],
    prices: tuple[str, ...],
    responses_api: bool | None,
    as_json: bool,
    **cloud: Any,
) -> None:
    changes = {
        "name": name,
        "base_url": _base_url(base_url, cloud.pop("endpoint_url")),
        "api_key": _api_key(api_key, api_key_env),
        "api_version": api_version,
        "headers": parse_pairs(headers, "--header") or None,
        "price_overrides": _prices(prices),
        "responses_api": responses_api,
    }
    body: dict[str, Any] = {k: v for k, v in changes.items() if v is not None}
    body.update(_cloud_fields(**cloud))
    client = admin_client()
    if workload_credentials:
        kind = client.get(f"/api/admin/providers/{provider_id}")["kind"]
        stored = STORED_CREDENTIAL.get(kind)
        if stored is None:
            raise click.UsageError(f"a {kind} provider has no cloud credentials to forget")
        if stored in body:
            raise click.UsageError("give new credentials or --workload-credentials, not both")
        body[stored] = None
    if not body:
        raise click.UsageError("nothing to change: give at least one option")
    row = client.patch(f"/api/admin/providers/{provider_id}", body)
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
