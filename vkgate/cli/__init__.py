"""The `vkgate` command line: run the services, and manage vkgate through the admin API."""

from __future__ import annotations

import click

from vkgate import env as E
from vkgate.cli._client import default_token, default_url
from vkgate.cli._context import CliContext
from vkgate.cli.budgets import audit, budgets, tokens
from vkgate.cli.cache_rules import cache_rules
from vkgate.cli.doctor import doctor
from vkgate.cli.keys import keys
from vkgate.cli.orgs import orgs, projects, teams
from vkgate.cli.providers import policies, providers
from vkgate.cli.secrets import secrets
from vkgate.cli.serve import controlplane, migrate, proxy, up
from vkgate.cli.spend import spend


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="vkgate")
@click.option("--url", help="Control plane URL [env VKGATE_CONTROLPLANE_URL].")
@click.option("--token", help="Admin token [env VKGATE_ADMIN_TOKEN, else VKGATE_HOME/secrets.env].")
@click.pass_context
def main(ctx: click.Context, url: str | None, token: str | None) -> None:
    """vkgate: an OpenAI-compatible LLM gateway with virtual keys."""
    env = E.environment()
    try:
        ctx.obj = CliContext(url=url or default_url(env), token=token or default_token(env))
    except E.SettingError as exc:
        raise click.ClickException(f"configuration: {exc}") from None


for command in (up, controlplane, proxy, migrate, orgs, teams, projects, providers, policies, keys):
    main.add_command(command)
for command in (budgets, cache_rules, tokens, audit, spend, doctor, secrets):
    main.add_command(command)
