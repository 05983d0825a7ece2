"""Throwaway databases: a SQLite file, or a fresh database on the local PostgreSQL server."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from sqlalchemy import delete, update
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.models import Base, FeedCounter

POSTGRES_ADMIN_DSN = os.environ.get(
    "TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def backends() -> list[str]:
    """Both by default; `TEST_DB_BACKENDS=sqlite` narrows a local run (CI runs both)."""
    chosen = os.environ.get("TEST_DB_BACKENDS", "sqlite,postgres")
    return [b.strip() for b in chosen.split(",") if b.strip()]


@contextmanager
def postgres_database() -> Iterator[str]:
    name = f"vkgate_test_{secrets.token_hex(6)}"
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def sqlite_database(directory: Path) -> Iterator[str]:
    yield f"sqlite:///{directory / 'controlplane.db'}"


async def empty_all_tables(engine: AsyncEngine) -> None:
    """Back to a freshly migrated state, faster than migrating again."""
    async with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            if table.name != FeedCounter.__tablename__:
                await conn.execute(delete(table))
        await conn.execute(update(FeedCounter).values(revision=0))
