"""What a request handler needs, wired once at start-up and passed down."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from litestar.connection import ASGIConnection
from sqlalchemy import Select, false
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute

from controlplane import audit
from controlplane.db import Database
from controlplane.errors import not_found
from controlplane.feed import service as feed
from controlplane.feed.service import FeedNotifier
from controlplane.internal.peers import ProxyVersions
from controlplane.ledger.store import Ledger
from controlplane.lifecycle import Lifecycle
from controlplane.metrics import Metrics
from controlplane.models import Base, Organization
from controlplane.readiness import ReadinessProbe
from controlplane.security import Cipher, Hasher
from controlplane.settings import ControlPlaneSettings
from controlplane.spend.pricing import Pricer
from controlplane.spend.readings import SpendReadings
from controlplane.throttle import AdminAuthThrottle
from vkgate.clock import Clock
from vkgate.wire import EventKind

M = TypeVar("M", bound=Base)


def owner_column(model: type[Base]) -> InstrumentedAttribute[Any] | None:
    """The column naming the organization a row of `model` belongs to (None: it has none)."""
    if model is Organization:
        return Organization.id
    column: InstrumentedAttribute[Any] | None = getattr(model, "organization_id", None)
    return column


def owner_of(row: Base) -> str | None:
    if isinstance(row, Organization):
        return row.id
    owner: str | None = getattr(row, "organization_id", None)
    return owner


@dataclass(frozen=True, slots=True)
class Tx:
    """One request's transaction, with the clock, the acting admin token's id, and the
    organization that token is bound to.

    `scope` is enforced here, in the two ways admin routes reach rows: `get` answers a row of
    another organization exactly as a missing one, and `scoped` narrows a list's query. So an
    id of another organization, in a path or in a body, cannot even be told to exist.
    """

    session: AsyncSession
    clock: Clock
    actor: str
    scope: str | None = None
    """The one organization this transaction may see; None sees every organization."""
    mutations: list[audit.Mutation] = field(default_factory=list)
    """Audited in this transaction; logged and counted once it commits."""

    def sees(self, organization_id: str | None) -> bool:
        """Whether a row of `organization_id` is within the scope."""
        return self.scope is None or organization_id == self.scope

    def scoped(self, query: Select[Any]) -> Select[Any]:
        """`query` (a select of one model) narrowed to the rows within the scope."""
        if self.scope is None:
            return query
        column = owner_column(query.column_descriptions[0]["entity"])
        # A model that belongs to no organization has no row an organization may see.
        return query.where(false() if column is None else column == self.scope)

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
        """The row, or 404 naming what was not found (also when it is outside the scope)."""
        row = await self.session.get(model, ident)
        if row is None or not self.sees(owner_of(row)):
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
    auth_throttle: AdminAuthThrottle
    proxy_versions: ProxyVersions
    readings: SpendReadings
    scope: str | None = None
    """Set on the view one request of an organization-bound admin token gets (`scoped_to`):
    its transactions see only that organization."""

    def scoped_to(self, organization_id: str | None) -> AppState:
        """This state as a request limited to `organization_id` sees it (None: unlimited)."""
        if organization_id is None:
            return self
        return dataclasses.replace(self, scope=organization_id)

    @asynccontextmanager
    async def write(self, actor: str) -> AsyncIterator[Tx]:
        """A write transaction; on commit, waiting long-polls are woken at once, and its
        audited mutations are logged and counted."""
        async with self.db.transaction() as session:
            tx = Tx(session=session, clock=self.clock, actor=actor, scope=self.scope)
            yield tx
        self.notifier.notify()
        for m in tx.mutations:
            self.metrics.admin_mutations.labels(m.resource_kind, m.action).inc()
        audit.committed(tx.mutations)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Tx]:
        async with self.db.transaction() as session:
            yield Tx(session=session, clock=self.clock, actor="", scope=self.scope)


def app_state(request: ASGIConnection[Any, Any, Any, Any]) -> AppState:
    """The application's state, for guards and as the `vk` dependency of handlers."""
    state: AppState = request.app.state["vk"]
    return state
