"""A throwaway PostgreSQL server of a test's own, which the test may stop and start again.

The machine's shared server (127.0.0.1:5432) serves every other test and must stay up; this
one lives in a temporary directory on a free port and is gone after the test.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import free_port

COMMAND_TIMEOUT_S = 60.0


def _bindir() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(candidates[-1]).parent if candidates else None


@dataclass
class PostgresServer:
    bindir: Path
    datadir: Path
    port: int
    as_owner: list[str]

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _pg_ctl(self, *args: str) -> None:
        command = [*self.as_owner, str(self.bindir / "pg_ctl"), "-D", str(self.datadir), *args]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
        assert done.returncode == 0, f"pg_ctl {' '.join(args)}: {done.stdout}{done.stderr}"

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = f"-p {self.port} -k {self.datadir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._pg_ctl("-w", "-l", str(self.datadir / "server.log"), "-o", options, "start")

    def stop(self) -> None:
        """A fast shutdown: open connections are cut, as in a restart or a failover."""
        self._pg_ctl("-w", "-m", "fast", "stop")


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    bindir = _bindir()
    if bindir is None or not (bindir / "initdb").exists():
        pytest.skip("PostgreSQL's server programs (initdb, pg_ctl) are not installed")
    datadir = Path(tempfile.mkdtemp(prefix="vkgate-pg-"))
    as_owner: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root: it runs as `postgres`
        owner = pwd.getpwnam("postgres")
        os.chown(datadir, owner.pw_uid, owner.pw_gid)
        as_owner = ["runuser", "-u", "postgres", "--"]
    server = PostgresServer(bindir, datadir, free_port(), as_owner)
    try:
        initdb = [str(bindir / "initdb"), "-D", str(datadir), "-A", "trust", "-U", "postgres"]
        subprocess.run(
            [*as_owner, *initdb, "--no-sync", "-E", "UTF8"],
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
            check=True,
        )
        server.start()
        yield server
    finally:
        if (datadir / "postmaster.pid").exists():
            server._pg_ctl("-w", "-m", "immediate", "stop")
        shutil.rmtree(datadir, ignore_errors=True)
