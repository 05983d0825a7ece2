"""Materialising a key's config bundle: everything a proxy needs to serve it, in one answer."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

import msgspec
from sqlalchemy import and_, or_, select

from controlplane.errors import ApiError
from controlplane.keys.service import KeyStatus
from controlplane.models import (
    Budget,
    CacheRule,
    Project,
    Provider,
    RoutingTarget,
    Team,
    VirtualKey,
)
from controlplane.providers.cloud import open_credentials
from controlplane.providers.service import open_api_key, open_headers
from controlplane.security import Cipher
from controlplane.spend.pricing import ListPrice, Pricer
from controlplane.state import Tx
from vkgate.clock import rfc3339
from vkgate.errors import ErrorCode
from vkgate.money import nanos_to_usd
from vkgate.windows import window_bounds
from vkgate.wire import (
    BudgetState,
    CacheRuleState,
    ChainTarget,
    ConfigBundle,
    Limits,
    Price,
    UnitPrice,
)

REFUSED = {
    KeyStatus.REVOKED: (ErrorCode.VIRTUAL_KEY_REVOKED, "virtual key is revoked"),
    KeyStatus.DISABLED: (ErrorCode.VIRTUAL_KEY_DISABLED, "virtual key is disabled"),
}


def refuse_if_unusable(key: VirtualKey, now: datetime) -> None:
    """403 for a revoked or disabled key, 401 for an expired one."""
    refused = REFUSED.get(KeyStatus(key.status))
    if refused is not None:
        raise ApiError(*refused)
    if key.expires_at is not None and key.expires_at <= now:
        raise ApiError(ErrorCode.VIRTUAL_KEY_EXPIRED, "virtual key has expired")


async def build(
    tx: Tx, *, cipher: Cipher, pricer: Pricer, vk_id: str, now: datetime
) -> ConfigBundle:
    """The bundle as of `now`, its budgets' windows included but not their spend (that comes
    from the ledger: spend/service.with_spend).

    Nothing in it depends on `now` but budget windows, a key's expiry and the price sheet in
    force, so the same rows give the same bytes, and so the same ETag, until one of those moves.
    """
    key = await tx.session.get(VirtualKey, vk_id)
    if key is None:
        raise ApiError(ErrorCode.NOT_FOUND, f"virtual key {vk_id!r} not found")
    refuse_if_unusable(key, now)
    project = await tx.get(Project, key.project_id, "project")
    team = await tx.session.get(Team, project.team_id) if project.team_id else None
    return ConfigBundle(
        vk_id=key.id,
        organization_id=key.organization_id,
        project_id=key.project_id,
        team_id=project.team_id,
        status=key.status,
        revision=key.revision,
        limits=msgspec.convert(key.limits, Limits),
        allowed_models=key.allowed_models,
        aliases=await _chains(tx, cipher, pricer, key.routing_policy_id, now),
        budgets=await _budgets(tx, key, project, now),
        expires_at=rfc3339(key.expires_at) if key.expires_at else None,
        metadata=dict(key.metadata_),
        team_limits=msgspec.convert(team.limits, Limits) if team is not None else Limits(),
        cache_rules=await _cache_rules(tx, key, project),
    )


async def _chains(
    tx: Tx, cipher: Cipher, pricer: Pricer, policy_id: str | None, now: datetime
) -> dict[str, list[ChainTarget]]:
    if policy_id is None:
        return {}
    rows = await tx.session.execute(
        select(RoutingTarget, Provider)
        .join(Provider, Provider.id == RoutingTarget.provider_id)
        .where(RoutingTarget.policy_id == policy_id)
        .order_by(RoutingTarget.alias, RoutingTarget.position)
    )
    chains: dict[str, list[ChainTarget]] = {}
    for target, provider in rows:
        listed = pricer.list_price(provider.kind, target.model, now)
        override = provider.price_overrides.get(target.model)
        chains.setdefault(target.alias, []).append(
            ChainTarget(
                provider_id=provider.id,
                provider_name=provider.name,
                kind=provider.kind,
                base_url=provider.base_url,
                model=target.model,
                api_key=open_api_key(cipher, provider),
                api_version=provider.api_version,
                headers=open_headers(cipher, provider),
                # The override wins, as it does when the ledger prices the spend.
                price=_override_price(override) if override else _wire_price(listed),
                max_output_tokens=listed.max_output_tokens if listed else None,
                unit_price=_override_units(override) if override else _wire_units(listed),
                responses_api=provider.responses_api,
                settings=dict(provider.settings),
                credentials=open_credentials(cipher, provider),
            )
        )
    return chains


def _override_price(override: dict[str, Any]) -> Price | None:
    if override.get("input_per_mtok") is None:
        return None  # priced by other units alone
    return msgspec.convert(
        {k: v for k, v in override.items() if k in Price.__struct_fields__}, Price
    )


def _override_units(override: dict[str, Any]) -> UnitPrice | None:
    units = {k: v for k, v in override.items() if k in UnitPrice.__struct_fields__}
    return msgspec.convert(units, UnitPrice) if units else None


def _wire_units(listed: ListPrice | None) -> UnitPrice | None:
    if listed is None:
        return None
    units = UnitPrice(
        input_audio_per_mtok=_optional_text(listed.input_audio_per_mtok),
        output_audio_per_mtok=_optional_text(listed.output_audio_per_mtok),
        input_image_per_mtok=_optional_text(listed.input_image_per_mtok),
        output_image_per_mtok=_optional_text(listed.output_image_per_mtok),
        per_character=_optional_text(listed.per_character),
        per_second=_optional_text(listed.per_second),
    )
    return units if units != UnitPrice() else None


def _wire_price(listed: ListPrice | None) -> Price | None:
    if listed is None or listed.input_per_mtok is None or listed.output_per_mtok is None:
        return None
    return Price(
        input_per_mtok=_decimal_text(listed.input_per_mtok),
        output_per_mtok=_decimal_text(listed.output_per_mtok),
        cache_read_per_mtok=_optional_text(listed.cache_read_per_mtok),
        cache_write_per_mtok=_optional_text(listed.cache_write_per_mtok),
    )


def _decimal_text(value: Decimal) -> str:
    """The shortest plain decimal: "0.15", "10", never "1E+1"."""
    return format(value.normalize(), "f")


def _optional_text(value: Decimal | None) -> str | None:
    return None if value is None else _decimal_text(value)


async def _budgets(tx: Tx, key: VirtualKey, project: Project, now: datetime) -> list[BudgetState]:
    scopes = [
        Budget.scope_kind == "organization",
        and_(Budget.scope_kind == "project", Budget.scope_id == project.id),
        and_(Budget.scope_kind == "virtual_key", Budget.scope_id == key.id),
        Budget.scope_kind == "end_user",
    ]
    if project.team_id is not None:
        scopes.append(and_(Budget.scope_kind == "team", Budget.scope_id == project.team_id))
    rows = await tx.session.scalars(
        select(Budget)
        .where(Budget.organization_id == key.organization_id, or_(*scopes))
        .order_by(Budget.id)
    )
    states = []
    for row in rows:
        start, end = window_bounds(row.window, now)
        states.append(
            BudgetState(
                budget_id=row.id,
                name=row.name,
                scope_kind=row.scope_kind,
                scope_id=row.scope_id,
                window=row.window,
                limit_usd=nanos_to_usd(row.limit_nano_usd),
                on_breach=row.on_breach,
                provider_id=row.provider_id,
                window_start=rfc3339(start) if start else None,
                window_end=rfc3339(end) if end else None,
            )
        )
    return states


async def _cache_rules(tx: Tx, key: VirtualKey, project: Project) -> list[CacheRuleState]:
    """The enabled cache rules whose scope covers the key."""
    scopes = [
        CacheRule.scope_kind == "organization",
        and_(CacheRule.scope_kind == "project", CacheRule.scope_id == project.id),
        and_(CacheRule.scope_kind == "virtual_key", CacheRule.scope_id == key.id),
    ]
    if project.team_id is not None:
        scopes.append(and_(CacheRule.scope_kind == "team", CacheRule.scope_id == project.team_id))
    rows = await tx.session.scalars(
        select(CacheRule)
        .where(
            CacheRule.organization_id == key.organization_id,
            CacheRule.enabled.is_(True),
            or_(*scopes),
        )
        .order_by(CacheRule.id)
    )
    return [
        CacheRuleState(
            rule_id=row.id,
            scope_kind=row.scope_kind,
            scope_id=row.scope_id,
            models=list(row.models),
            ttl_seconds=row.ttl_seconds,
        )
        for row in rows
    ]
