"""Virtual key lifecycle rules. The raw key exists only in the answer that creates it."""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import msgspec
from sqlalchemy import select

from controlplane.errors import conflict, invalid
from controlplane.keys.schemas import KeyCreate, KeyUpdate
from controlplane.models import Project, RoutingPolicy, RoutingTarget, VirtualKey, VirtualKeySecret
from controlplane.security import Hasher, new_id, new_virtual_key
from controlplane.state import Tx
from vkgate.keys import display_prefix
from vkgate.wire import EventKind


class KeyStatus(StrEnum):
    ACTIVE = "active"
    DISABLED = "disabled"
    REVOKED = "revoked"


async def _policy_aliases(tx: Tx, policy_id: str, organization_id: str) -> set[str]:
    policy = await tx.get(RoutingPolicy, policy_id, "routing policy", param="routing_policy_id")
    if policy.organization_id != organization_id:
        raise invalid(
            "routing_policy_id belongs to another organization", param="routing_policy_id"
        )
    aliases = await tx.session.scalars(
        select(RoutingTarget.alias).where(RoutingTarget.policy_id == policy_id).distinct()
    )
    return set(aliases)


def _check_allowed(allowed: list[str] | None, aliases: set[str]) -> None:
    if allowed is None:
        return
    unknown = sorted(set(allowed) - aliases)
    if unknown:
        raise invalid(
            f"allowed_models names aliases the routing policy does not have: {', '.join(unknown)}",
            param="allowed_models",
        )


def _check_future(tx: Tx, expires_at: datetime | None) -> None:
    if expires_at is not None and expires_at <= tx.clock.now():
        raise invalid("expires_at must be in the future", param="expires_at")


async def _check_name_free(tx: Tx, project_id: str, name: str, *, other_than: str = "") -> None:
    taken = await tx.session.scalar(
        select(VirtualKey.id).where(
            VirtualKey.project_id == project_id,
            VirtualKey.name == name,
            VirtualKey.id != other_than,
        )
    )
    if taken:
        raise conflict(f"a virtual key named {name!r} already exists in this project", param="name")


def _new_secret(tx: Tx, hasher: Hasher, vk_id: str) -> tuple[str, VirtualKeySecret]:
    key = new_virtual_key()
    secret = VirtualKeySecret(
        vk_id=vk_id,
        key_hash=hasher.of_secret(key),
        pepper_id=hasher.pepper_id,
        prefix=display_prefix(key),
        created_at=tx.clock.now(),
        valid_until=None,
    )
    tx.session.add(secret)
    return key, secret


async def create(tx: Tx, hasher: Hasher, data: KeyCreate) -> tuple[VirtualKey, str]:
    project = await tx.get(Project, data.project_id, "project", param="project_id")
    aliases = await _policy_aliases(tx, data.routing_policy_id, project.organization_id)
    _check_allowed(data.allowed_models, aliases)
    _check_future(tx, data.expires_at)
    await _check_name_free(tx, project.id, data.name)
    now = tx.clock.now()
    row = VirtualKey(
        id=new_id("vk"),
        organization_id=project.organization_id,
        project_id=project.id,
        name=data.name,
        routing_policy_id=data.routing_policy_id,
        allowed_models=data.allowed_models,
        limits=msgspec.to_builtins(data.limits) if data.limits else {},
        metadata_=data.metadata or {},
        status=KeyStatus.ACTIVE.value,
        expires_at=data.expires_at,
        revision=0,
        created_at=now,
        updated_at=now,
    )
    tx.session.add(row)
    await tx.session.flush()
    key, _ = _new_secret(tx, hasher, row.id)
    await _changed(tx, row, EventKind.VK_CREATED, "virtual_key.create", {"name": row.name})
    return row, key


async def update(tx: Tx, vk_id: str, data: KeyUpdate) -> VirtualKey:
    """Apply the fields given; a PATCH that changes nothing records nothing and wakes no proxy."""
    row = await _mutable(tx, vk_id)

    def given(value: Any, current: Any) -> Any:
        return current if value is msgspec.UNSET else value

    wanted: dict[str, Any] = {
        "name": given(data.name, row.name),
        "routing_policy_id": given(data.routing_policy_id, row.routing_policy_id),
        "allowed_models": given(data.allowed_models, row.allowed_models),
        "limits": row.limits
        if data.limits is msgspec.UNSET
        else (msgspec.to_builtins(data.limits) if data.limits else {}),
        "expires_at": given(data.expires_at, row.expires_at),
        "metadata_": row.metadata_ if data.metadata is msgspec.UNSET else (data.metadata or {}),
    }
    changed = [field for field, value in wanted.items() if value != getattr(row, field)]
    if not changed:
        return row
    if "name" in changed:
        await _check_name_free(tx, row.project_id, wanted["name"], other_than=row.id)
    if wanted["routing_policy_id"] is None:
        raise invalid(
            "the key has no routing policy; set routing_policy_id", param="routing_policy_id"
        )
    if {"routing_policy_id", "allowed_models"} & set(changed):
        aliases = await _policy_aliases(tx, wanted["routing_policy_id"], row.organization_id)
        _check_allowed(wanted["allowed_models"], aliases)
    if "expires_at" in changed:
        _check_future(tx, wanted["expires_at"])
    for field in changed:
        setattr(row, field, wanted[field])
    row.updated_at = tx.clock.now()
    fields = [f.rstrip("_") for f in changed]
    await _changed(tx, row, EventKind.VK_CONFIG_UPDATED, "virtual_key.update", {"fields": fields})
    return row


async def rotate(
    tx: Tx, hasher: Hasher, vk_id: str, *, grace_seconds: int
) -> tuple[VirtualKey, str, datetime]:
    """Issue a new key; the current one keeps working for `grace_seconds` (0: stops now)."""
    row = await _mutable(tx, vk_id)
    valid_until = tx.clock.now() + timedelta(seconds=grace_seconds)
    live = await tx.session.scalars(
        select(VirtualKeySecret).where(VirtualKeySecret.vk_id == row.id)
    )
    for secret in live:
        if secret.valid_until is None or secret.valid_until > valid_until:
            secret.valid_until = valid_until
    key, _ = _new_secret(tx, hasher, row.id)
    row.updated_at = tx.clock.now()
    await _changed(
        tx, row, EventKind.VK_ROTATED, "virtual_key.rotate", {"grace_seconds": grace_seconds}
    )
    return row, key, valid_until


async def revoke(tx: Tx, vk_id: str) -> VirtualKey:
    """One-way. Revoking a revoked key changes nothing and records nothing."""
    row = await tx.get(VirtualKey, vk_id, "virtual key")
    if row.status == KeyStatus.REVOKED:
        return row
    row.status = KeyStatus.REVOKED.value
    row.updated_at = tx.clock.now()
    await _changed(tx, row, EventKind.VK_REVOKED, "virtual_key.revoke", {})
    return row


async def set_enabled(tx: Tx, vk_id: str, *, enabled: bool) -> VirtualKey:
    row = await _mutable(tx, vk_id)
    wanted = KeyStatus.ACTIVE if enabled else KeyStatus.DISABLED
    if row.status == wanted:
        return row
    row.status = wanted.value
    row.updated_at = tx.clock.now()
    if enabled:
        await _changed(tx, row, EventKind.VK_ENABLED, "virtual_key.enable", {})
    else:
        await _changed(tx, row, EventKind.VK_DISABLED, "virtual_key.disable", {})
    return row


async def _mutable(tx: Tx, vk_id: str) -> VirtualKey:
    row = await tx.get(VirtualKey, vk_id, "virtual key")
    if row.status == KeyStatus.REVOKED:
        raise conflict(f"virtual key {vk_id!r} is revoked; revocation cannot be undone")
    return row


async def _changed(
    tx: Tx, row: VirtualKey, kind: EventKind, action: str, details: dict[str, Any]
) -> None:
    await tx.audit(action, "virtual_key", row.id, row.organization_id, details)
    row.revision = await tx.event(
        kind,
        organization_id=row.organization_id,
        entity_kind="virtual_key",
        entity_id=row.id,
        vk_id=row.id,
    )
