"""Alembic environment: migrates the URL `vkgate migrate` passes in, online only."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from controlplane.db import sqlite_pragmas
from controlplane.migrate import record_compatibility
from controlplane.models import Base

config = context.config
url = config.get_main_option("sqlalchemy.url")
if not url:
    raise RuntimeError("sqlalchemy.url is not set; run migrations with `vkgate migrate`")

engine = create_engine(url, poolclass=pool.NullPool)
if engine.dialect.name == "sqlite":
    sqlite_pragmas(engine)

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=engine.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()
        # In the migrations' transaction where DDL is transactional (PostgreSQL): the schema
        # never exists without its marker.
        record_compatibility(connection, context.script)
    if connection.in_transaction():
        # SQLite's DDL is not run in one transaction: the marker's write began its own.
        connection.commit()
engine.dispose()
