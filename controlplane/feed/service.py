"""Appending to and reading the change feed, and waking the polls that wait on it."""

from __future__ import annotations

import asyncio

from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.models import ChangeEvent, FeedCounter
from vkgate.clock import Clock
from vkgate.wire import EventKind


class FeedNotifier:
    """Wakes every waiting long-poll of this process when a write transaction commits.

    A poll takes a `ticket()` before it reads the feed and waits on that ticket: a write that
    commits between the read and the wait has already set it, so its wake-up is not lost.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.waiting = 0
        """Long-polls waiting right now (each holds a request, never a database connection)."""

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def ticket(self) -> asyncio.Event:
        """Set by the next `notify()`; take it before reading what a wake-up would change."""
        return self._event

    async def wait(self, timeout: float, ticket: asyncio.Event | None = None) -> bool:
        """True when woken by a write (since `ticket` was taken), False when `timeout` passed."""
        event = self._event if ticket is None else ticket
        self.waiting += 1
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return False
        finally:
            self.waiting -= 1
        return True


async def append(
    session: AsyncSession,
    *,
    clock: Clock,
    kind: EventKind,
    organization_id: str,
    entity_kind: str,
    entity_id: str,
    vk_id: str | None = None,
) -> int:
    """Append one event and return its revision.

    The counter row is locked by the UPDATE until this transaction commits, so events become
    visible in revision order: no poller can skip one that commits late.
    """
    result = await session.execute(
        update(FeedCounter)
        .where(FeedCounter.id == 1)
        .values(revision=FeedCounter.revision + 1)
        .returning(FeedCounter.revision)
    )
    revision = int(result.scalar_one())
    if session.get_bind().dialect.name == "postgresql":
        # Delivered at commit, to every replica's listener; see feed/listener.py.
        await session.execute(text("SELECT pg_notify('vkgate_feed', '')"))
    session.add(
        ChangeEvent(
            revision=revision,
            kind=kind.value,
            organization_id=organization_id,
            entity_kind=entity_kind,
            entity_id=entity_id,
            vk_id=vk_id,
            at=clock.now(),
        )
    )
    return revision


async def current_revision(session: AsyncSession) -> int:
    value = await session.scalar(select(FeedCounter.revision).where(FeedCounter.id == 1))
    return int(value or 0)


async def read(
    session: AsyncSession, *, since: int, up_to: int, organization_id: str | None, limit: int
) -> list[ChangeEvent]:
    query = select(ChangeEvent).where(ChangeEvent.revision > since, ChangeEvent.revision <= up_to)
    if organization_id is not None:
        query = query.where(ChangeEvent.organization_id == organization_id)
    rows = await session.scalars(query.order_by(ChangeEvent.revision).limit(limit))
    return list(rows)
