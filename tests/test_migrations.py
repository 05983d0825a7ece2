"""Migrations: apply on an empty database of each backend, match the models, and reverse."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, pool

from controlplane.db import sync_url
from controlplane.migrate import alembic_config, is_current, upgrade
from controlplane.models import Base
from tests.support import databases


@pytest.fixture(params=databases.backends())
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres":
        with databases.postgres_database() as url:
            yield url
    else:
        with databases.sqlite_database(tmp_path) as url:
            yield url


def _differences(url: str) -> list[object]:
    engine = create_engine(sync_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = create_engine(sync_url(url), poolclass=pool.NullPool)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrations_build_exactly_the_models_schema(empty_database: str) -> None:
    assert not is_current(empty_database)
    upgrade(empty_database)
    assert is_current(empty_database)
    assert _differences(empty_database) == []


def test_migrations_downgrade_to_empty_and_upgrade_again(empty_database: str) -> None:
    upgrade(empty_database)
    command.downgrade(alembic_config(empty_database), "base")
    assert _tables(empty_database) <= {"alembic_version"}
    upgrade(empty_database)
    assert set(Base.metadata.tables) <= _tables(empty_database)
