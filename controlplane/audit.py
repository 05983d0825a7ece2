"""The audit log: one row per admin mutation, naming the token that made it (never the token)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.models import AuditEntry
from vkgate.clock import Clock


async def record(
    session: AsyncSession,
    *,
    clock: Clock,
    actor: str,
    action: str,
    resource_kind: str,
    resource_id: str,
    organization_id: str | None,
    details: dict[str, Any] | None = None,
) -> None:
    session.add(
        AuditEntry(
            at=clock.now(),
            actor=actor,
            action=action,
            resource_kind=resource_kind,
            resource_id=resource_id,
            organization_id=organization_id,
            details=details or {},
        )
    )
