"""Running the relational migrations programmatically (`vkgate migrate`, `vkgate up`, tests)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

import migrations
from controlplane.db import is_sqlite, sync_url
from controlplane.ledger import migrate as ledger_migrate
from controlplane.settings import LedgerLocation


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # `%` is Alembic's interpolation character; a password may contain one.
    config.set_main_option("sqlalchemy.url", sync_url(database_url).replace("%", "%%"))
    return config


MIGRATION_LOCK = 0x766B67617465
"""The PostgreSQL advisory lock every migrating process takes ("vkgate" in ASCII)."""


@contextmanager
def migrating(database_url: str) -> Iterator[None]:
    """Hold the migration lock of the database for the block.

    Replicas that all start with `--migrate` on one PostgreSQL database would otherwise run the
    same DDL at once, and all but one fail on a duplicate type or table. With the lock the first
    applies the migrations and the others find them applied. SQLite is one process's file: no
    lock is needed.
    """
    if is_sqlite(database_url):
        yield
        return
    # Autocommit: the session holding the lock is idle, not "idle in transaction", so a server's
    # idle_in_transaction_session_timeout cannot end it (and free the lock) mid-migration.
    engine = create_engine(sync_url(database_url), poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            # Session-level: held until released or the connection ends, whichever comes first.
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
            try:
                yield
            finally:
                # A lost connection has released the lock already; the migrations' own outcome
                # is what the caller must hear about.
                with suppress(SQLAlchemyError):
                    connection.execute(
                        text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK}
                    )
    finally:
        engine.dispose()


def upgrade(database_url: str) -> None:
    if is_sqlite(database_url):
        path = sync_url(database_url).removeprefix("sqlite:///")
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(database_url), "head")


def upgrade_stores(database_url: str, ledger: LedgerLocation) -> list[str]:
    """Migrate the database, then the spend ledger, under the migration lock; the ledger
    migrations applied, by name."""
    with migrating(database_url):
        upgrade(database_url)
        return ledger_migrate.upgrade(ledger)


def is_current(database_url: str) -> bool:
    """True when the database is at the newest migration."""
    config = alembic_config(database_url)
    head = ScriptDirectory.from_config(config).get_current_head()
    engine = create_engine(sync_url(database_url), poolclass=NullPool)
    try:
        with engine.connect() as connection:
            current = MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
    return current == head
