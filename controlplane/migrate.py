"""Running the relational migrations programmatically (`vkgate migrate`, `vkgate up`, tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

import migrations
from controlplane.db import is_sqlite, sync_url


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # `%` is Alembic's interpolation character; a password may contain one.
    config.set_main_option("sqlalchemy.url", sync_url(database_url).replace("%", "%%"))
    return config


def upgrade(database_url: str) -> None:
    if is_sqlite(database_url):
        path = sync_url(database_url).removeprefix("sqlite:///")
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(database_url), "head")


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
