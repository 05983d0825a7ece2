"""What every admin subcommand shares: the control plane's URL and the admin token."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import click

from vkgate.cli._client import AdminClient
from vkgate.cli._output import json_option, show

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class CliContext:
    url: str
    token: str | None
    _client: AdminClient | None = field(default=None, repr=False)

    def client(self) -> AdminClient:
        if self._client is None:
            if not self.token:
                raise click.ClickException(
                    "no admin token: set VKGATE_ADMIN_TOKEN, pass --token, or run `vkgate up` "
                    "in this directory first"
                )
            self._client = AdminClient(self.url, self.token)
        return self._client


def admin_client() -> AdminClient:
    return click.get_current_context().find_object(CliContext).client()  # type: ignore[union-attr]


def parse_pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    """`KEY=VALUE` options into a dict, naming the option on a malformed one."""
    pairs: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=option)
        pairs[name] = value
    return pairs


def add_resource_commands(
    group: click.Group,
    path: str,
    columns: Sequence[str],
    *,
    what: str,
    listing: Literal["by_org", "all", "own"] = "by_org",
    delete_verb: str | None = None,
) -> None:
    """Give `group` its `list` (unless it has its own), `show ID` and, when the resource can
    be deleted, `<delete_verb> ID` commands."""
    if listing != "own":
        org_option = click.option("--org", "org_id", help="Only those of this organization.")

        def list_all(org_id: str | None = None, as_json: bool = False) -> None:
            filters = {"organization_id": org_id} if org_id else {}
            show(list(admin_client().list_all(path, **filters)), columns, as_json=as_json)

        command = json_option(list_all)
        if listing == "by_org":
            command = org_option(command)
        group.command("list", help=f"List every {what}.")(command)

    @group.command("show", help=f"Show one {what}.")
    @click.argument("ident", metavar="ID")
    @json_option
    def show_one(ident: str, as_json: bool) -> None:
        show(admin_client().get(f"{path}/{ident}"), columns, as_json=as_json)

    if delete_verb is None:
        return

    @group.command(delete_verb, help=f"{delete_verb.capitalize()} a {what}.")
    @click.argument("ident", metavar="ID")
    def delete_one(ident: str) -> None:
        admin_client().delete(f"{path}/{ident}")
        click.echo(f"{delete_verb.removesuffix('e')}ed {ident}")
