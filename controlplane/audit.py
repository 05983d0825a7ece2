"""The audit log: one row per admin mutation, naming the token that made it (never the token)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.models import AuditEntry
from vkgate.clock import Clock
from vkgate.logs import event

log = logging.getLogger("vkgate.controlplane.audit")


@dataclass(frozen=True, slots=True)
class Mutation:
    """What an audit row says, without its details: what logs and metrics may carry."""

    actor: str
    action: str
    resource_kind: str
    resource_id: str
    organization_id: str | None


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
) -> Mutation:
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
    return Mutation(actor, action, resource_kind, resource_id, organization_id)


def committed(mutations: Sequence[Mutation]) -> None:
    """Log mutations whose transaction has committed (a rolled-back one never happened)."""
    for m in mutations:
        event(
            log,
            "admin_mutation",
            actor=m.actor,
            action=m.action,
            resource_kind=m.resource_kind,
            resource_id=m.resource_id,
            organization_id=m.organization_id,
        )
