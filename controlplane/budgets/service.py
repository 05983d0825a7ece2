"""Budget rules: a scope names something of the budget's own organization."""

from __future__ import annotations

import msgspec

from controlplane.budgets.schemas import BudgetCreate, BudgetScope, BudgetUpdate, ScopeKind
from controlplane.errors import invalid
from controlplane.models import Budget, Organization, Project, Provider, Team, VirtualKey
from controlplane.schemas import nothing_given
from controlplane.security import new_id
from controlplane.state import Tx
from vkgate.money import usd_to_nanos
from vkgate.wire import EventKind

_SCOPE_MODELS: dict[ScopeKind, tuple[type[Team] | type[Project] | type[VirtualKey], str]] = {
    ScopeKind.TEAM: (Team, "team"),
    ScopeKind.PROJECT: (Project, "project"),
    ScopeKind.VIRTUAL_KEY: (VirtualKey, "virtual key"),
}


async def _scope_id(tx: Tx, organization_id: str, scope: BudgetScope) -> str | None:
    if scope.kind is ScopeKind.ORGANIZATION:
        if scope.id not in (None, organization_id):
            raise invalid(
                "an organization budget's scope.id is its organization_id", param="scope.id"
            )
        return organization_id
    if scope.kind is ScopeKind.END_USER:
        return scope.id
    if scope.id is None:
        raise invalid(f"a {scope.kind} budget needs scope.id", param="scope.id")
    model, label = _SCOPE_MODELS[scope.kind]
    row = await tx.get(model, scope.id, label, param="scope.id")
    if row.organization_id != organization_id:
        raise invalid(f"scope.id names a {label} of another organization", param="scope.id")
    return scope.id


def _limit_nanos(limit_usd: str) -> int:
    """The limit in nano-USD, refused when 0: such a budget would refuse every request of its
    scope, which is more plainly said by disabling the scope's keys."""
    nanos = usd_to_nanos(limit_usd)
    if nanos <= 0:
        raise invalid(f"limit_usd must be more than 0, got {limit_usd!r}", param="limit_usd")
    return nanos


async def _check_provider(tx: Tx, organization_id: str, provider_id: str | None) -> None:
    if provider_id is None:
        return
    provider = await tx.get(Provider, provider_id, "provider", param="provider_id")
    if provider.organization_id != organization_id:
        raise invalid("provider_id belongs to another organization", param="provider_id")


async def create(tx: Tx, data: BudgetCreate) -> Budget:
    limit_nanos = _limit_nanos(data.limit_usd)
    await tx.get(Organization, data.organization_id, "organization", param="organization_id")
    scope_id = await _scope_id(tx, data.organization_id, data.scope)
    await _check_provider(tx, data.organization_id, data.provider_id)
    now = tx.clock.now()
    row = Budget(
        id=new_id("bud"),
        organization_id=data.organization_id,
        name=data.name,
        scope_kind=data.scope.kind.value,
        scope_id=scope_id,
        window=data.window.value,
        limit_nano_usd=limit_nanos,
        provider_id=data.provider_id,
        on_breach=data.on_breach.value,
        created_at=now,
        updated_at=now,
    )
    tx.session.add(row)
    await _record(tx, row, EventKind.BUDGET_CREATED, "budget.create")
    return row


async def update(tx: Tx, budget_id: str, data: BudgetUpdate) -> Budget:
    row = await tx.get(Budget, budget_id, "budget")
    if nothing_given(data):
        return row
    if data.limit_usd is not msgspec.UNSET:
        row.limit_nano_usd = _limit_nanos(data.limit_usd)
    if data.provider_id is not msgspec.UNSET:
        await _check_provider(tx, row.organization_id, data.provider_id)
        row.provider_id = data.provider_id
    if data.name is not msgspec.UNSET:
        row.name = data.name
    if data.window is not msgspec.UNSET:
        row.window = data.window.value
    if data.on_breach is not msgspec.UNSET:
        row.on_breach = data.on_breach.value
    row.updated_at = tx.clock.now()
    await _record(tx, row, EventKind.BUDGET_UPDATED, "budget.update")
    return row


async def delete(tx: Tx, budget_id: str) -> None:
    row = await tx.get(Budget, budget_id, "budget")
    await _record(tx, row, EventKind.BUDGET_DELETED, "budget.delete")
    await tx.session.delete(row)


async def _record(tx: Tx, row: Budget, kind: EventKind, action: str) -> None:
    await tx.audit(
        action,
        "budget",
        row.id,
        row.organization_id,
        {"scope_kind": row.scope_kind, "scope_id": row.scope_id, "window": row.window},
    )
    await tx.event(
        kind, organization_id=row.organization_id, entity_kind="budget", entity_id=row.id
    )
