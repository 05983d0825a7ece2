"""Cache rules: a scope names something of the rule's own organization; every change is an
event of the change feed, so each proxy recompiles the keys it covers."""

from __future__ import annotations

import msgspec

from controlplane.cache_rules.schemas import (
    CacheRuleCreate,
    CacheRuleUpdate,
    CacheScope,
    CacheScopeKind,
)
from controlplane.errors import invalid
from controlplane.models import CacheRule, Organization, Project, Team, VirtualKey
from controlplane.schemas import nothing_given
from controlplane.security import new_id
from controlplane.state import Tx
from vkgate.wire import EventKind

_SCOPE_MODELS: dict[CacheScopeKind, tuple[type[Team] | type[Project] | type[VirtualKey], str]] = {
    CacheScopeKind.TEAM: (Team, "team"),
    CacheScopeKind.PROJECT: (Project, "project"),
    CacheScopeKind.VIRTUAL_KEY: (VirtualKey, "virtual key"),
}


async def _scope_id(tx: Tx, organization_id: str, scope: CacheScope) -> str:
    if scope.kind is CacheScopeKind.ORGANIZATION:
        if scope.id not in (None, organization_id):
            raise invalid(
                "an organization rule's scope.id is its organization_id", param="scope.id"
            )
        return organization_id
    if scope.id is None:
        raise invalid(f"a {scope.kind} rule needs scope.id", param="scope.id")
    model, label = _SCOPE_MODELS[scope.kind]
    row = await tx.get(model, scope.id, label, param="scope.id")
    if row.organization_id != organization_id:
        raise invalid(f"scope.id names a {label} of another organization", param="scope.id")
    return scope.id


async def create(tx: Tx, data: CacheRuleCreate) -> CacheRule:
    await tx.get(Organization, data.organization_id, "organization", param="organization_id")
    scope_id = await _scope_id(tx, data.organization_id, data.scope)
    now = tx.clock.now()
    row = CacheRule(
        id=new_id("cr"),
        organization_id=data.organization_id,
        name=data.name,
        scope_kind=data.scope.kind.value,
        scope_id=scope_id,
        models=list(data.models),
        ttl_seconds=data.ttl_seconds,
        enabled=data.enabled,
        created_at=now,
        updated_at=now,
    )
    tx.session.add(row)
    await _record(tx, row, EventKind.CACHE_RULE_CREATED, "cache_rule.create")
    return row


async def update(tx: Tx, rule_id: str, data: CacheRuleUpdate) -> CacheRule:
    row = await tx.get(CacheRule, rule_id, "cache rule")
    if nothing_given(data):
        return row
    if data.name is not msgspec.UNSET:
        row.name = data.name
    if data.models is not msgspec.UNSET:
        row.models = list(data.models)
    if data.ttl_seconds is not msgspec.UNSET:
        row.ttl_seconds = data.ttl_seconds
    if data.enabled is not msgspec.UNSET:
        row.enabled = data.enabled
    row.updated_at = tx.clock.now()
    await _record(tx, row, EventKind.CACHE_RULE_UPDATED, "cache_rule.update")
    return row


async def delete(tx: Tx, rule_id: str) -> None:
    row = await tx.get(CacheRule, rule_id, "cache rule")
    await _record(tx, row, EventKind.CACHE_RULE_DELETED, "cache_rule.delete")
    await tx.session.delete(row)


async def _record(tx: Tx, row: CacheRule, kind: EventKind, action: str) -> None:
    await tx.audit(
        action,
        "cache_rule",
        row.id,
        row.organization_id,
        {
            "scope_kind": row.scope_kind,
            "scope_id": row.scope_id,
            "models": row.models,
            "ttl_seconds": row.ttl_seconds,
            "enabled": row.enabled,
        },
    )
    await tx.event(
        kind, organization_id=row.organization_id, entity_kind="cache_rule", entity_id=row.id
    )
