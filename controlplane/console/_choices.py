"""The rows a form offers to pick from, within the token's organization scope."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select

from controlplane.console._core import CHOICES
from controlplane.models import Organization, Project, Provider, RoutingPolicy, Team
from controlplane.state import Tx


async def _named(tx: Tx, model: Any) -> Sequence[Any]:
    query = tx.scoped(select(model)).order_by(model.name, model.id).limit(CHOICES)
    return list(await tx.session.scalars(query))


async def organizations(tx: Tx) -> Sequence[Organization]:
    return await _named(tx, Organization)


async def teams(tx: Tx) -> Sequence[Team]:
    return await _named(tx, Team)


async def projects(tx: Tx) -> Sequence[Project]:
    return await _named(tx, Project)


async def providers(tx: Tx) -> Sequence[Provider]:
    return await _named(tx, Provider)


async def policies(tx: Tx) -> Sequence[RoutingPolicy]:
    return await _named(tx, RoutingPolicy)


def names(rows: Sequence[Any]) -> dict[str, str]:
    """id → name, to show names where the rows hold ids."""
    return {row.id: row.name for row in rows}
