"""Running the relational migrations programmatically (`vkgate migrate`, `vkgate up`, tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

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
