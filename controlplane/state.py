"""What a request handler needs, wired once at start-up and passed down."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from litestar.connection import ASGIConnection
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane import audit
from controlplane.db import Database
from controlplane.errors import not_found
from controlplane.feed import service as feed
from controlplane.feed.service import FeedNotifier
from controlplane.ledger.store import Ledger
from controlplane.lifecycle import Lifecycle
from controlplane.metrics import Metrics
from controlplane.models import Base
from controlplane.readiness import ReadinessProbe
from controlplane.security import Cipher, Hasher
from controlplane.settings import ControlPlaneSettings
from controlplane.spend.pricing import Pricer
from vkgate.clock import Clock
from vkgate.wire import EventKind

M = TypeVar("M", bound=Base)


@dataclass(frozen=True, slots=True)
class Tx:
    """One request's transaction, with the clock and the acting admin token's id."""

    session: AsyncSession
    clock: Clock
    actor: str
    mutations: list[audit.Mutation] = field(default_factory=list)
    """Audited in this transaction; logged and counted once it commits."""

    async def audit(
        self,
        action: str,
        resource_kind: str,
        resource_id: str,
        organization_id: str | None,
        details: dict[str, Any] | None = None,
    ) -> None:
        mutation = await audit.record(
            self.session,
            clock=self.clock,
            actor=self.actor,
            action=action,
            resource_kind=resource_kind,
            resource_id=resource_id,
            organization_id=organization_id,
            details=details,
        )
        self.mutations.append(mutation)

    async def event(
        self,
        kind: EventKind,
        *,
        organization_id: str,
        entity_kind: str,
        entity_id: str,
        vk_id: str | None = None,
    ) -> int:
        return await feed.append(
            self.session,
            clock=self.clock,
            kind=kind,
            organization_id=organization_id,
            entity_kind=entity_kind,
            entity_id=entity_id,
            vk_id=vk_id,
        )

    async def get(self, model: type[M], ident: str, kind: str, *, param: str | None = None) -> M:
        """The row, or 404 naming what was not found."""
        row = await self.session.get(model, ident)
        if row is None:
            raise not_found(kind, ident, param=param)
        return row


@dataclass(frozen=True, slots=True)
class AppState:
    settings: ControlPlaneSettings
    db: Database
    clock: Clock
    cipher: Cipher
    hasher: Hasher
    notifier: FeedNotifier
    metrics: Metrics
    ledger: Ledger
    pricer: Pricer
    lifecycle: Lifecycle
    readiness: ReadinessProbe

    @asynccontextmanager
    async def write(self, actor: str) -> AsyncIterator[Tx]:
        """A write transaction; on commit, waiting long-polls are woken at once, and its
        audited mutations are logged and counted."""
        async with self.db.transaction() as session:
            tx = Tx(session=session, clock=self.clock, actor=actor)
            yield tx
        self.notifier.notify()
        for m in tx.mutations:
            self.metrics.admin_mutations.labels(m.resource_kind, m.action).inc()
        audit.committed(tx.mutations)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Tx]:
        async with self.db.transaction() as session:
            yield Tx(session=session, clock=self.clock, actor="")


def app_state(request: ASGIConnection[Any, Any, Any, Any]) -> AppState:
    """The application's state, for guards and as the `vk` dependency of handlers."""
    state: AppState = request.app.state["vk"]
    return state
