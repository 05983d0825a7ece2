"""What every admin subcommand shares: the control plane's URL and the admin token."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

from vkgate.cli._client import AdminClient

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
