"""Types shared by every admin resource: names, ids, pages, and request plumbing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Generic, TypeVar

import msgspec
from litestar import Request
from litestar.di import NamedDependency, Provide
from sqlalchemy import Select
from sqlalchemy.orm import InstrumentedAttribute

from controlplane.auth import Actor
from controlplane.errors import invalid
from controlplane.state import AppState, Tx, app_state

T = TypeVar("T")
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^\S(.*\S)?$")]
Ident = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
MAX_PAGE = 1000
DEFAULT_PAGE = 100
Positive = Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000_000)]


class RateLimits(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The rate limits of a key or of a team; a limit left out or null is no limit."""

    rpm: Positive | None = None
    tpm: Positive | None = None
    rpd: Positive | None = None
    max_concurrency: Positive | None = None


def check_limits_are_integers(body: Any, field: str = "limits") -> None:
    """Refuse a limit that is not a JSON integer.

    Litestar converts a body leniently (`"5"` and `5.0` both become 5); a limit someone sent as
    text or as a fraction is more likely a mistake than a wish, so `body[field]` (the request's
    JSON as sent) is checked again strictly. Call it after Litestar's own validation.
    """
    limits = body.get(field) if isinstance(body, dict) else None
    if not isinstance(limits, dict):
        return
    for name, value in limits.items():
        if value is not None and type(value) is not int:
            raise invalid(
                f"{field}.{name} must be a whole number of 1 or more, or null "
                f"(got {type(value).__name__} {value!r})",
                param=f"{field}.{name}",
            )


class Page(msgspec.Struct, Generic[T]):
    data: list[T]
    next_cursor: str | None = None


def actor_id(request: Request[Any, Any, Any]) -> str:
    actor: Actor = request.state.actor
    return actor.id


def request_state(request: Request[Any, Any, Any]) -> AppState:
    """The application state as this request may see it: limited to one organization when an
    organization-bound admin token makes it (the guard has put its actor on the request)."""
    actor: Actor | None = getattr(request.state, "actor", None)
    state = app_state(request)
    return state.scoped_to(actor.organization_id if actor else None)


DEPENDENCIES = {"vk": Provide(request_state, sync_to_thread=False)}
Vk = NamedDependency[AppState]
"""How a handler asks for the application state: `vk: Vk`."""


def page_size(limit: int | None) -> int:
    if limit is None:
        return DEFAULT_PAGE
    if not 1 <= limit <= MAX_PAGE:
        raise invalid(f"limit must be between 1 and {MAX_PAGE}", param="limit")
    return limit


def nothing_given(update: msgspec.Struct) -> bool:
    """True for a PATCH body that names no field: it changes nothing and records nothing."""
    return all(getattr(update, f) is msgspec.UNSET for f in update.__struct_fields__)


def filtered(query: Select[Any], filters: dict[InstrumentedAttribute[Any], Any]) -> Select[Any]:
    """`query` narrowed to rows whose column equals each wanted value that was given."""
    for column, value in filters.items():
        if value is not None:
            query = query.where(column == value)
    return query


async def page(
    tx: Tx,
    query: Select[Any],
    key: InstrumentedAttribute[Any],
    *,
    limit: int | None,
    cursor: str | None,
    numeric: bool = False,
) -> tuple[Sequence[Any], str | None]:
    """Rows ordered by `key` after `cursor`, and the cursor of the next page if there is one;
    only those within the transaction's organization scope.

    `numeric` for an integer key, whose cursor is its decimal text.
    """
    size = page_size(limit)
    query = tx.scoped(query)
    if cursor:
        query = query.where(key > (_numeric_cursor(cursor) if numeric else cursor))
    rows = list(await tx.session.scalars(query.order_by(key).limit(size + 1)))
    if len(rows) > size:
        rows = rows[:size]
        return rows, str(getattr(rows[-1], key.key))
    return rows, None


MAX_ID = 2**63 - 1
"""The largest integer key the databases store (BIGINT)."""


def _numeric_cursor(cursor: str) -> int:
    """An integer key's cursor: 0-9 only (`isdigit` alone also takes `²`, which `int` refuses),
    and no larger than any key can be (the database would refuse the comparison)."""
    if not (cursor.isascii() and cursor.isdigit()) or int(cursor) > MAX_ID:
        raise invalid("cursor must be a cursor this route returned", param="cursor")
    return int(cursor)
