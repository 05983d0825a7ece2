"""The rate-limit options a key or a team takes: --rpm, --tpm, --rpd, --max-concurrency."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

LIMIT_OPTIONS = ("rpm", "tpm", "rpd", "max_concurrency")


def limit_options(function: F) -> F:
    """Adds one option per limit; the command receives them as `rpm`, `tpm`, `rpd` and
    `max_concurrency` (None when not given)."""
    positive = click.IntRange(min=1)
    for option in reversed(
        [
            click.option("--rpm", type=positive, help="Requests per minute."),
            click.option("--tpm", type=positive, help="Tokens (input + output) per minute."),
            click.option("--rpd", type=positive, help="Requests per day."),
            click.option("--max-concurrency", type=positive, help="Requests in flight at once."),
        ]
    ):
        function = option(function)
    return function


def limits_of(given: dict[str, Any]) -> dict[str, int]:
    """The limits among a command's parameters that were given."""
    return {name: given[name] for name in LIMIT_OPTIONS if given.get(name) is not None}
