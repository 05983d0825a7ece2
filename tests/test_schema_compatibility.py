"""Upgrades that can be rolled back: migrations expand, then contract, and record which code may
run on the schema they make, so the previous release's control plane runs on the newest schema
(with a warning) and refuses, saying what to do, one it cannot run on."""

from __future__ import annotations

import logging
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, pool, select

from controlplane.app import create_app
from controlplane.db import Database, sync_url
from controlplane.db import create_engine as create_async_engine
from controlplane.migrate import (
    COMPATIBLE_FROM,
    MIGRATIONS,
    SchemaTooNew,
    alembic_config,
    migrate_to,
    schema_state,
    upgrade,
)
from controlplane.models import SchemaCompatibility
from controlplane.settings import ControlPlaneSettings
from tests.conftest import Internal, seed_world, serve_in_loop
from tests.support import databases
from tests.support.clock import ManualClock
from tests.support.env import secrets_env
from tests.support.processes import clean_env, vkgate
from vkgate.cli.doctor._result import Status
from vkgate.cli.doctor._stores import check_database
from vkgate.keys import key_sha256


@pytest.fixture(params=databases.backends())
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres":
        with databases.postgres_database() as url:
            yield url
    else:
        with databases.sqlite_database(tmp_path) as url:
            yield url


def scripts() -> ScriptDirectory:
    return ScriptDirectory(str(MIGRATIONS))


def previous_release(tmp_path: Path) -> Path:
    """This release's migrations without the newest: the previous release's directory."""
    directory = tmp_path / "previous-migrations"
    shutil.copytree(MIGRATIONS, directory, ignore=shutil.ignore_patterns("__pycache__"))
    newest = scripts().get_revision(scripts().get_current_head())
    assert newest is not None
    (directory / "versions" / Path(newest.path).name).unlink()
    return directory


def next_release(tmp_path: Path, *, contracts: bool) -> tuple[Path, str]:
    """This release's migrations and one more, which drops a column this release's code reads
    when it `contracts`, and only adds one otherwise."""
    directory = tmp_path / "next-migrations"
    shutil.copytree(MIGRATIONS, directory, ignore=shutil.ignore_patterns("__pycache__"))
    head = scripts().get_current_head()
    column = 'sa.Column("{}", sa.String(length={}), nullable=True)'
    change, undo = (
        ('drop_column("api_version")', f"add_column({column.format('api_version', 64)})")
        if contracts
        else (f"add_column({column.format('note', 40)})", 'drop_column("note")')
    )
    declaration = f'{COMPATIBLE_FROM} = "9001"' if contracts else ""
    (directory / "versions" / "9001_next.py").write_text(
        textwrap.dedent(
            f'''\
            """the next release's migration"""
            import sqlalchemy as sa
            from alembic import op

            revision = "9001"
            down_revision = "{head}"
            branch_labels = None
            depends_on = None
            {declaration}


            def upgrade() -> None:
                with op.batch_alter_table("providers") as batch:
                    batch.{change}


            def downgrade() -> None:
                with op.batch_alter_table("providers") as batch:
                    batch.{undo}
            '''
        )
    )
    return directory, "9001"


def marker(url: str) -> tuple[str, str] | None:
    engine = create_engine(sync_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            row = connection.execute(
                select(SchemaCompatibility.revision, SchemaCompatibility.compatible_from)
            ).first()
            return None if row is None else (row.revision, row.compatible_from)
    finally:
        engine.dispose()


def test_every_migration_run_records_the_oldest_revision_whose_code_runs_on_the_schema(
    empty_database: str,
) -> None:
    upgrade(empty_database)
    head = scripts().get_current_head()
    # Every migration so far only expands: the code of the first still runs on the newest.
    assert marker(empty_database) == (head, "0001")
    assert schema_state(empty_database).current


def test_the_previous_releases_code_runs_on_the_newest_schema_with_a_warning(
    empty_database: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    upgrade(empty_database)
    previous = previous_release(tmp_path)
    state = schema_state(empty_database, previous)
    assert state.newer and state.compatible and state.usable
    assert "newer than this release's" in state.describe()
    # Its `vkgate migrate` (the chart's hook runs it on a rollback) has nothing to do.
    with caplog.at_level(logging.WARNING, logger="vkgate.controlplane.migrate"):
        upgrade(empty_database, previous)
    assert "nothing to apply" in caplog.text
    assert marker(empty_database) == (scripts().get_current_head(), "0001")


async def test_a_control_plane_serves_on_the_schema_of_the_previous_release_and_of_the_next(
    empty_database: str, tmp_path: Path, clock: ManualClock
) -> None:
    """Its keys, providers and budgets work on a schema a newer release expanded."""
    directory, _ = next_release(tmp_path, contracts=False)
    upgrade(empty_database, directory)
    state = schema_state(empty_database)
    assert state.newer and state.usable
    settings = ControlPlaneSettings.from_env(secrets_env(empty_database))
    database = Database(create_async_engine(empty_database))
    try:
        app = create_app(settings, clock=clock, database=database)
        async with serve_in_loop(app, "http://controlplane.test") as http:
            world = await seed_world(http)
            resolved = await Internal(http, clock).call(
                "POST", "/api/internal/gateway/resolve-key", {"key_sha256": key_sha256(world.key)}
            )
            assert resolved.status_code == 200, resolved.text
            assert resolved.json()["bundle"]["aliases"]["fast"][0]["api_key"]
    finally:
        await database.close()


def test_a_contracting_migration_stops_older_code_naming_how_to_go_back(
    empty_database: str, tmp_path: Path
) -> None:
    directory, revision = next_release(tmp_path, contracts=True)
    upgrade(empty_database, directory)
    assert marker(empty_database) == (revision, revision)
    state = schema_state(empty_database)
    assert state.newer and not state.usable
    head = scripts().get_current_head()
    with pytest.raises(SchemaTooNew) as refused:
        upgrade(empty_database)
    assert f"needs code of revision {revision} or newer" in str(refused.value)
    assert f"vkgate migrate --to {head}" in str(refused.value)
    # The newer release takes its schema back down; this one then runs on it.
    migrate_to(empty_database, head, directory)
    assert schema_state(empty_database).current
    assert marker(empty_database) == (head, "0001")


def columns(url: str) -> dict[str, dict[str, dict[str, Any]]]:
    engine = create_engine(sync_url(url), poolclass=pool.NullPool)
    try:
        found = inspect(engine)
        return {
            table: {c["name"]: c for c in found.get_columns(table)}
            for table in found.get_table_names()
            if table != "alembic_version"
        }
    finally:
        engine.dispose()


def test_every_migration_only_expands_unless_it_declares_which_code_runs_on_it(
    empty_database: str,
) -> None:
    """The previous release's code reads every table and column it knew, as it knew them:
    a migration that drops, renames or retypes one, or adds a column older code cannot insert
    rows without, must say `compatible_from`."""
    config = alembic_config(empty_database)
    chain = list(reversed(list(scripts().walk_revisions())))
    before: dict[str, dict[str, dict[str, Any]]] = {}
    for script in chain:
        command.upgrade(config, script.revision)
        after = columns(empty_database)
        if getattr(script.module, COMPATIBLE_FROM, None) is None:
            broken = []
            for table, known in before.items():
                if table not in after:
                    broken.append(f"table {table} dropped")
                    continue
                for name, column in known.items():
                    now = after[table].get(name)
                    if now is None:
                        broken.append(f"{table}.{name} dropped")
                    elif str(now["type"]) != str(column["type"]):
                        broken.append(f"{table}.{name} retyped {column['type']} -> {now['type']}")
                    elif column["nullable"] and not now["nullable"]:
                        broken.append(f"{table}.{name} made NOT NULL")
                for name, column in after[table].items():
                    if name not in known and not column["nullable"] and column["default"] is None:
                        broken.append(f"{table}.{name} added NOT NULL without a default")
            assert not broken, (
                f"migration {script.revision} contracts ({'; '.join(broken)}) without "
                f"declaring {COMPATIBLE_FROM}"
            )
        before = after


def test_vkgate_migrate_to_moves_the_schema_down_and_the_control_plane_says_it_is_behind(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    env = clean_env(**secrets_env(url), VKGATE_LEDGER_URL=f"chdb://{tmp_path / 'ledger'}")
    assert vkgate("migrate", env=env).returncode == 0
    moved = vkgate("migrate", "--to", "0003", env=env)
    assert moved.returncode == 0, moved.stderr
    assert "database schema at revision 0003" in moved.stdout
    assert schema_state(url).behind
    unknown = vkgate("migrate", "--to", "0999", env=env)
    assert unknown.returncode == 1
    assert "0999 is not a migration of this release" in unknown.stderr


def test_doctor_warns_of_a_newer_schema_this_release_runs_on(
    empty_database: str, tmp_path: Path
) -> None:
    directory, _ = next_release(tmp_path, contracts=False)
    upgrade(empty_database, directory)
    result = check_database(empty_database)
    assert result.status is Status.WARN
    assert "newer than this release's" in result.detail
