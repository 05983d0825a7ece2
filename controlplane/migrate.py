"""Running the relational migrations programmatically (`vkgate migrate`, `vkgate up`, tests),
and telling whether this release's code may run on a database's schema.

Migrations expand, then contract: one that only adds (a table, a nullable column) leaves the
code of earlier releases able to run on the schema it makes; one that takes away what earlier
code uses declares so with a module attribute `compatible_from = "<revision>"`, the oldest
revision whose code runs on it. Every migration run records the result in the schema itself
(`schema_compatibility`), so a release that does not know a newer schema's migrations can
still read whether it may run on it: that is what lets a deployment be rolled back (`helm
rollback`) without a downgrade of the database.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, create_engine, delete, insert, inspect, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

import migrations
from controlplane.db import is_sqlite, sync_url
from controlplane.ledger import migrate as ledger_migrate
from controlplane.models import SchemaCompatibility
from controlplane.settings import LedgerLocation

MIGRATIONS = Path(migrations.__file__).parent
COMPATIBLE_FROM = "compatible_from"
"""The attribute a contracting migration sets: the oldest revision whose code runs on it."""


def alembic_config(database_url: str, scripts: Path = MIGRATIONS) -> Config:
    """`scripts`: the migrations directory, this release's unless a test says otherwise."""
    config = Config()
    config.set_main_option("script_location", str(scripts))
    # `%` is Alembic's interpolation character; a password may contain one.
    config.set_main_option("sqlalchemy.url", sync_url(database_url).replace("%", "%%"))
    return config


log = logging.getLogger("vkgate.controlplane.migrate")

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


class SchemaTooNew(Exception):
    """The database's schema is of a newer release that this release's code cannot run on."""


@dataclass(frozen=True, slots=True)
class SchemaState:
    """A database's schema as this release's code sees it."""

    revision: str | None
    """The database's revision (None: never migrated)."""
    head: str
    """This release's newest migration."""
    known: bool
    """Whether this release has the database's revision among its migrations."""
    compatible_from: str | None = None
    """For a schema newer than this release: the oldest revision whose code runs on it, as
    the schema records it (None: it records nothing)."""
    compatible: bool = False
    """For a newer schema: whether this release's code is at least `compatible_from`."""

    @property
    def current(self) -> bool:
        return self.revision == self.head

    @property
    def behind(self) -> bool:
        """Migrations of this release are not applied yet."""
        return self.revision is None or (self.known and not self.current)

    @property
    def newer(self) -> bool:
        return self.revision is not None and not self.known

    @property
    def usable(self) -> bool:
        """Whether this release's code may serve on the schema."""
        return self.current or (self.newer and self.compatible)

    def describe(self) -> str:
        if self.current:
            return f"schema current ({self.head})"
        if self.behind:
            return f"schema at revision {self.revision or 'none'}, the newest is {self.head}"
        if self.compatible:
            return (
                f"schema at revision {self.revision}, newer than this release's {self.head}; "
                f"it records that code from revision {self.compatible_from} on runs on it, so "
                "this release serves on it (as after a rollback)"
            )
        needs = (
            f"needs code of revision {self.compatible_from} or newer"
            if self.compatible_from
            else "records no compatibility (a release before the marker made it)"
        )
        return (
            f"schema at revision {self.revision} of a newer release, which {needs}; this "
            f"release's newest migration is {self.head}: run the newer release, or downgrade "
            f"the schema with it first (`vkgate migrate --to {self.head}`)"
        )


def schema_state(database_url: str, scripts: Path = MIGRATIONS) -> SchemaState:
    script_dir = ScriptDirectory.from_config(alembic_config(database_url, scripts))
    head = script_dir.get_current_head()
    assert head is not None, "the migrations directory has no migration"
    engine = create_engine(sync_url(database_url), poolclass=NullPool)
    try:
        with engine.connect() as connection:
            revision = MigrationContext.configure(connection).get_current_revision()
            known = revision is None or _knows(script_dir, revision)
            if known:
                return SchemaState(revision, head, known=True)
            marker = _marker(connection)
    finally:
        engine.dispose()
    compatible_from = marker.compatible_from if marker is not None else None
    return SchemaState(
        revision,
        head,
        known=False,
        compatible_from=compatible_from,
        compatible=compatible_from is not None and _knows(script_dir, compatible_from),
    )


def _knows(script_dir: ScriptDirectory, revision: str) -> bool:
    try:
        return script_dir.get_revision(revision) is not None
    except CommandError:
        return False


def _marker(connection: Connection) -> SchemaCompatibility | None:
    if not inspect(connection).has_table(SchemaCompatibility.__tablename__):
        return None
    row = connection.execute(
        select(SchemaCompatibility.revision, SchemaCompatibility.compatible_from)
    ).first()
    if row is None:
        return None
    return SchemaCompatibility(revision=row.revision, compatible_from=row.compatible_from)


def compatible_from(script_dir: ScriptDirectory, revision: str) -> str:
    """The oldest revision whose code runs on the schema `revision` makes: the newest
    declaration of a migration up to it, or the first migration when none declares one (every
    migration so far only expands)."""
    oldest = revision
    for script in script_dir.walk_revisions(base="base", head=revision):
        declared = getattr(script.module, COMPATIBLE_FROM, None)
        if declared:
            return str(declared)
        oldest = script.revision
    return oldest


def record_compatibility(connection: Connection, script_dir: ScriptDirectory) -> None:
    """Write the schema's marker, in the migration run's own transaction (migrations/env.py):
    a schema downgraded below the marker's table has none, which is right too."""
    revision = MigrationContext.configure(connection).get_current_revision()
    if revision is None or not inspect(connection).has_table(SchemaCompatibility.__tablename__):
        return
    connection.execute(delete(SchemaCompatibility))
    connection.execute(
        insert(SchemaCompatibility).values(
            id=1, revision=revision, compatible_from=compatible_from(script_dir, revision)
        )
    )


def upgrade(database_url: str, scripts: Path = MIGRATIONS) -> None:
    """Apply this release's pending migrations. A schema of a newer release is left as it is
    when this release may run on it (a rollback), and `SchemaTooNew` when it may not."""
    if is_sqlite(database_url):
        path = sync_url(database_url).removeprefix("sqlite:///")
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    state = schema_state(database_url, scripts)
    if state.newer:
        _newer(state)
        return
    command.upgrade(alembic_config(database_url, scripts), "head")


def _newer(state: SchemaState) -> None:
    if not state.compatible:
        raise SchemaTooNew(state.describe())
    log.warning("migrations: %s; nothing to apply", state.describe())


def migrate_to(database_url: str, revision: str, scripts: Path = MIGRATIONS) -> None:
    """Move the schema to `revision` of this release's migrations, down or up: before rolling
    back to a release that cannot run on this one's schema."""
    config = alembic_config(database_url, scripts)
    script_dir = ScriptDirectory.from_config(config)
    if not _knows(script_dir, revision):
        raise SchemaTooNew(
            f"{revision} is not a migration of this release (its newest is "
            f"{script_dir.get_current_head()})"
        )
    state = schema_state(database_url, scripts)
    if state.newer:
        raise SchemaTooNew(
            f"the schema is at revision {state.revision}, which this release does not know: "
            "downgrade it with the release that made it"
        )
    ordered = [s.revision for s in script_dir.walk_revisions()]  # newest first
    if state.revision is not None and ordered.index(revision) > ordered.index(state.revision):
        command.downgrade(config, revision)
    else:
        command.upgrade(config, revision)


def upgrade_stores(database_url: str, ledger: LedgerLocation) -> list[str]:
    """Migrate the database, then the spend ledger, under the migration lock; the ledger
    migrations applied, by name."""
    with migrating(database_url):
        upgrade(database_url)
        return ledger_migrate.upgrade(ledger)


def is_current(database_url: str) -> bool:
    """True when the database is at the newest migration."""
    return schema_state(database_url).current
