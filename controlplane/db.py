"""Database engines and the unit of work: one transaction per request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.types import TypeDecorator


def async_url(url: str) -> str:
    """The async driver form of a configured URL (aiosqlite for SQLite, psycopg 3 for Postgres)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite").render_as_string(hide_password=False)
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def sync_url(url: str) -> str:
    """The sync driver form, for Alembic."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return parsed.set(drivername="sqlite").render_as_string(hide_password=False)
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def sqlite_pragmas(sync_engine: Any) -> None:
    """Foreign keys on, WAL and a generous lock wait: SQLite's defaults suit none of this."""
    event.listen(sync_engine, "connect", _sqlite_pragmas)


def create_engine(url: str) -> AsyncEngine:
    # hide_parameters: a logged or raised statement never carries bound values (hashes, sealed
    # credentials, names), whatever goes wrong.
    if is_sqlite(url):
        engine = create_async_engine(
            async_url(url), connect_args={"timeout": 30}, hide_parameters=True
        )
        sqlite_pragmas(engine.sync_engine)
        return engine
    return create_async_engine(
        async_url(url), pool_size=10, max_overflow=10, pool_pre_ping=True, hide_parameters=True
    )


class Database:
    """The engine and a session factory; `transaction()` is the unit of work."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.sessions = async_sessionmaker(engine, expire_on_commit=False)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        async with self.sessions() as session, session.begin():
            yield session

    async def close(self) -> None:
        await self.engine.dispose()


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in and out on every backend (SQLite keeps no zone of its own)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
