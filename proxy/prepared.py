"""A request read and resolved by its route: what dispatch sends, and what its records say."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import msgspec

from proxy.formats import Exchange
from proxy.limits.budgets import Worst

if TYPE_CHECKING:
    from proxy.dispatch import Outcome
    from proxy.providers import Upstream
    from vkgate.spend import SpendRecord


class Meter(Protocol):
    """Counts what a served request used when tokens alone do not say it (audio, images)."""

    def measure(self, record: SpendRecord, outcome: Outcome) -> None:
        """Fill the outcome record's usage: its tokens as the provider reported them (never a
        tokenizer's guess at an upload) and the units the call is priced in."""
        ...


@dataclass(slots=True)
class Prepared:
    """A request read and resolved: what dispatch sends, and what the spend record says of it."""

    model: str
    exchange: Exchange
    end_user: str | None
    body: bytes
    """Kept for a token estimate when the provider reports no usage."""
    max_output: int | None = None
    """The most output tokens the request allows (`max_tokens` times `n`), when it says."""
    meter: Meter | None = None
    """Reads the usage of a route that is not metered by tokens alone."""
    estimate: int = 0
    """With `worst`: the tokens the rate limits take up front (else sized from the body)."""
    worst: Worst | None = None
    """What the budgets reserve (else sized from the body and `max_output`)."""
    narrow: Callable[[tuple[Upstream, ...]], tuple[Upstream, ...]] | None = None
    """Keeps the credentials of the alias's chain that can serve this request (a stored
    response's own, for `previous_response_id`), or refuses it."""
    messages: list[msgspec.Raw] | None = None
    """A chat request's messages, each its JSON as sent: what the request guardrails read
    first."""
