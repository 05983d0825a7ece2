"""Control-plane replicas starting together: one migration at a time, a ledger outage survived,
and a warning when replicas would split the spend across embedded ledgers."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from controlplane.db import sync_url
from controlplane.migrate import MIGRATION_LOCK, is_current, migrating
from tests.support.databases import postgres_database
from tests.support.env import secrets_env
from tests.support.processes import CLI_TIMEOUT_S, clean_env, free_port, running, vkgate

REPLICAS = 3


@pytest.fixture
def fresh_postgres() -> Iterator[str]:
    with postgres_database() as url:
        yield url


def test_replicas_migrating_one_fresh_database_at_once_all_succeed(
    fresh_postgres: str, tmp_path: Path
) -> None:
    # Without the lock two of three such starts on an empty database failed on a duplicate
    # type; with it the first migrates and the others find the schema current.
    started: list[subprocess.Popen[str]] = []
    try:
        outputs = _migrate_at_once(fresh_postgres, tmp_path, started)
    finally:
        for process in started:  # only if something above failed: each has ended otherwise
            if process.poll() is None:
                process.kill()
                process.wait()
    assert [p.returncode for p in started] == [0] * REPLICAS, outputs
    assert all("migrations applied" in output for output in outputs), outputs
    assert is_current(fresh_postgres)


def _migrate_at_once(
    database_url: str, tmp_path: Path, started: list[subprocess.Popen[str]]
) -> list[str]:
    for i in range(REPLICAS):
        home = tmp_path / f"replica-{i}"  # each its own embedded ledger
        home.mkdir()
        env = clean_env(**secrets_env(database_url), VKGATE_HOME=str(home))
        started.append(
            subprocess.Popen(
                [sys.executable, "-m", "vkgate", "migrate"],
                env=env,
                cwd=home,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return [process.communicate(timeout=CLI_TIMEOUT_S)[0] for process in started]


def test_the_migration_lock_is_held_for_the_block_and_released_after(
    fresh_postgres: str,
) -> None:
    engine = create_engine(sync_url(fresh_postgres), poolclass=NullPool)
    probe = text("SELECT pg_try_advisory_lock(:key)")
    unlock = text("SELECT pg_advisory_unlock(:key)")
    try:
        with engine.connect() as other:
            with migrating(fresh_postgres):
                assert other.execute(probe, {"key": MIGRATION_LOCK}).scalar() is False
            assert other.execute(probe, {"key": MIGRATION_LOCK}).scalar() is True
            other.execute(unlock, {"key": MIGRATION_LOCK})
    finally:
        engine.dispose()


def test_a_sqlite_database_takes_no_lock(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'controlplane.db'}"
    with migrating(url):
        pass
    assert not (tmp_path / "controlplane.db").exists()  # not even opened


@pytest.fixture
def migrated_postgres(fresh_postgres: str, tmp_path: Path) -> dict[str, str]:
    """The environment of a control plane whose database is migrated (its own ledger aside)."""
    env = clean_env(**secrets_env(fresh_postgres), VKGATE_HOME=str(tmp_path))
    migrated = vkgate("migrate", env=env, cwd=tmp_path)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    return env


def serve_on(env: dict[str, str], ledger_url: str, tmp_path: Path) -> str:
    """Start `vkgate controlplane` on `ledger_url`; its log once it served and stopped."""
    port = free_port()
    env = {**env, "VKGATE_CONTROLPLANE_ADDR": f"127.0.0.1:{port}", "VKGATE_LEDGER_URL": ledger_url}
    log = tmp_path / "controlplane.log"
    with running(["controlplane"], env=env, port=port, log=log, cwd=tmp_path):
        pass
    return log.read_text()


def test_an_unreachable_clickhouse_ledger_does_not_stop_the_control_plane(
    migrated_postgres: dict[str, str], tmp_path: Path
) -> None:
    # Keys must keep resolving while the ledger is down: the proxies hold spend in their spools.
    output = serve_on(migrated_postgres, f"http://127.0.0.1:{free_port()}/vkgate", tmp_path)
    assert "spend ledger (VKGATE_LEDGER_URL) unreachable at start-up" in output
    assert "run `vkgate migrate`" not in output
    # The embedded ledger's split-spend warning is about chDB only.
    assert "each replica keeps part of the spend" not in output


def test_a_clickhouse_ledger_that_never_answers_holds_the_start_up_only_briefly(
    migrated_postgres: dict[str, str], tmp_path: Path
) -> None:
    # Accepted by the kernel, never read: without a bound the client would wait 300 s, twice.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        output = serve_on(migrated_postgres, f"http://127.0.0.1:{port}/vkgate", tmp_path)
    assert "spend ledger (VKGATE_LEDGER_URL) unreachable at start-up" in output


class _Refusing(http.server.BaseHTTPRequestHandler):
    """Answers every query as ClickHouse answers a wrong password."""

    def do_POST(self) -> None:
        self._refuse()

    def do_GET(self) -> None:
        self._refuse()

    def _refuse(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b"Code: 516. DB::Exception: default: Authentication failed. (AUTHENTICATION_FAILED)"
        self.send_response(403)
        self.send_header("X-ClickHouse-Exception-Code", "516")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_clickhouse_ledger_that_refuses_stops_the_start_up_with_its_reason(
    migrated_postgres: dict[str, str], tmp_path: Path
) -> None:
    # A wrong password is a configuration error: serving on would fail every spend shipment.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {
            **migrated_postgres,
            "VKGATE_CONTROLPLANE_ADDR": f"127.0.0.1:{free_port()}",
            "VKGATE_LEDGER_URL": f"http://127.0.0.1:{server.server_address[1]}/vkgate",
        }
        result = vkgate("controlplane", env=env, cwd=tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "VKGATE_LEDGER_URL" in result.stderr
    assert "Authentication failed" in result.stderr
    assert "unreachable" not in result.stdout + result.stderr


def embedded_ledger_log(database_url: str, tmp_path: Path) -> str:
    """The log of `vkgate controlplane --migrate` on `database_url` and an embedded ledger,
    once it served and stopped."""
    port = free_port()
    env = clean_env(
        **secrets_env(database_url),
        VKGATE_HOME=str(tmp_path),
        VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{port}",
    )
    log = tmp_path / "controlplane.log"
    with running(["controlplane", "--migrate"], env=env, port=port, log=log, cwd=tmp_path):
        pass
    return log.read_text()


def test_postgres_with_an_embedded_ledger_warns_that_replicas_would_split_spend(
    fresh_postgres: str, tmp_path: Path
) -> None:
    output = embedded_ledger_log(fresh_postgres, tmp_path)
    assert "each replica keeps part of the spend" in output
    assert str(tmp_path / "ledger") in output


def test_sqlite_with_an_embedded_ledger_gives_no_such_warning(tmp_path: Path) -> None:
    output = embedded_ledger_log(f"sqlite:///{tmp_path / 'controlplane.db'}", tmp_path)
    assert "each replica keeps part of the spend" not in output
