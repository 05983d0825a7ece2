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


class Page(msgspec.Struct, Generic[T]):
    data: list[T]
    next_cursor: str | None = None


def actor_id(request: Request[Any, Any, Any]) -> str:
    actor: Actor = request.state.actor
    return actor.id


DEPENDENCIES = {"vk": Provide(app_state, sync_to_thread=False)}
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
    """Rows ordered by `key` after `cursor`, and the cursor of the next page if there is one.

    `numeric` for an integer key, whose cursor is its decimal text.
    """
    size = page_size(limit)
    if cursor:
        if numeric and not cursor.isdigit():
            raise invalid("cursor must be a cursor this route returned", param="cursor")
        query = query.where(key > (int(cursor) if numeric else cursor))
    rows = list(await tx.session.scalars(query.order_by(key).limit(size + 1)))
    if len(rows) > size:
        rows = rows[:size]
        return rows, str(getattr(rows[-1], key.key))
    return rows, None
