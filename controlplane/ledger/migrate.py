"""The ledger's DDL: `migrations/clickhouse/NNNN_name.sql`, applied in order, each file once.

Applied files are recorded, with a digest of their text, in `vkgate_ledger_migrations`; a
recorded file whose text changed afterwards is refused (add a new file instead). Every
statement must be safe to run twice (`IF NOT EXISTS`): a file that fails half-way is run again
whole, and two control planes starting at once may both apply it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import migrations
from controlplane.ledger.client import LedgerError, connect, require_engine
from controlplane.settings import LedgerLocation

DIRECTORY = Path(migrations.__file__).parent / "clickhouse"
TABLE = "vkgate_ledger_migrations"
_NAME = re.compile(r"^\d{4}_[a-z0-9_]+\.sql$")
_BOOKKEEPING = f"""
CREATE TABLE IF NOT EXISTS {TABLE}
(
    name String,
    sha256 String,
    applied_at DateTime64(6, 'UTC') DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree
ORDER BY name
"""


@dataclass(frozen=True, slots=True)
class Migration:
    name: str
    sha256: str
    statements: tuple[str, ...]


def statements_of(text: str) -> tuple[str, ...]:
    """The `;`-separated statements of a file, without `--` comment lines."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
    return tuple(s.strip() for s in "\n".join(lines).split(";") if s.strip())


def available(directory: Path = DIRECTORY) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        if not _NAME.match(path.name):
            raise LedgerError(f"{path}: ledger migrations are named NNNN_lowercase_name.sql")
        text = path.read_text()
        digest = hashlib.sha256(text.encode()).hexdigest()
        found.append(Migration(path.name, digest, statements_of(text)))
    return found


def _applied(client: Any) -> dict[str, str]:
    if str(client.command(f"EXISTS TABLE {TABLE}")) != "1":
        return {}
    result = client.query(f"SELECT name, sha256 FROM {TABLE} FINAL")  # noqa: S608 - a constant
    return {str(name): str(digest) for name, digest in result.result_rows}


def pending(client: Any, directory: Path = DIRECTORY) -> list[Migration]:
    """The files not yet applied, in order; a changed applied file is an error."""
    applied = _applied(client)
    waiting = []
    for migration in available(directory):
        digest = applied.get(migration.name)
        if digest is None:
            waiting.append(migration)
        elif digest != migration.sha256:
            raise LedgerError(
                f"ledger migration {migration.name} changed after it was applied; "
                "put the change in a new file instead"
            )
    return waiting


def apply(client: Any, directory: Path = DIRECTORY) -> list[str]:
    """Apply what is pending on an open client; the names of the files applied."""
    client.command(_BOOKKEEPING)
    done = []
    for migration in pending(client, directory):
        for statement in migration.statements:
            client.command(statement)
        client.insert(TABLE, [[migration.name, migration.sha256]], column_names=["name", "sha256"])
        done.append(migration.name)
    return done


def upgrade(location: LedgerLocation, directory: Path = DIRECTORY) -> list[str]:
    """`vkgate migrate` for the ledger: create its database and apply what is pending."""
    from clickhouse_connect.driver.exceptions import Error

    client = connect(location, create_database=True)
    try:
        return apply(client, directory)
    except Error as exc:
        raise LedgerError(f"a ledger migration failed at {location.display}: {exc}") from None
    finally:
        client.close()


def is_current(
    location: LedgerLocation, directory: Path = DIRECTORY, *, timeout_s: float | None = None
) -> bool:
    """True when the ledger exists and every migration file has been applied; LedgerError when
    it cannot be reached or opened (within `timeout_s` per step, for a server ledger)."""
    from clickhouse_connect.driver.exceptions import Error

    # Raised, not answered False: "run `vkgate migrate`" would not help without chDB.
    require_engine(location)
    if location.kind == "chdb" and not (location.path and location.path.is_dir()):
        return False  # without opening chDB, which would create the directory
    try:
        client = connect(location, timeout_s=timeout_s)
    except LedgerError as exc:
        if exc.cause == "no_database":
            return False
        # Unreachable or refused: "run `vkgate migrate`" would be the wrong advice.
        raise
    try:
        return not pending(client, directory)
    except Error as exc:
        raise LedgerError(f"cannot read the ledger at {location.display}: {exc}") from None
    finally:
        client.close()
