"""`vkgate doctor`: its checks one by one, then the command against a real control plane."""

from __future__ import annotations

import errno
import importlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis

from controlplane.migrate import upgrade
from tests.support import databases
from tests.support.clock import ManualClock
from tests.support.env import INTERNAL_SECRET, secrets_env
from tests.support.processes import Service, clean_env, free_port, sqlite_controlplane, vkgate
from vkgate import __version__ as VERSION
from vkgate import signing
from vkgate.cli.doctor._config import (
    Scope,
    check_metrics_address,
    check_secrets_file,
    read_configuration,
    secret_values,
)
from vkgate.cli.doctor._controlplane import check_controlplane, check_internal_api
from vkgate.cli.doctor._result import Result, Status, redacted
from vkgate.cli.doctor._spool import (
    Backlog,
    check_spool_backlog,
    check_spool_directory,
    check_spool_space,
    survey_spool,
)
from vkgate.cli.doctor._stores import check_database, check_redis
from vkgate.clock import SystemClock

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PASSWORD = "hunter2-do-not-print"


def redis_available() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def postgres_available() -> bool:
    try:
        with psycopg.connect(databases.POSTGRES_ADMIN_DSN, connect_timeout=2):
            return True
    except psycopg.Error:
        return False


def closed_port() -> int:
    return free_port()  # bound, then closed: nothing listens there


# --- the checks, one by one -----------------------------------------------------------------


def test_settings_come_from_the_secrets_file_with_the_environment_winning(tmp_path: Path) -> None:
    stored = secrets_env(f"sqlite:///{tmp_path / 'cp.db'}")
    (tmp_path / "secrets.env").write_text("".join(f"{k}={v}\n" for k, v in stored.items()))
    override = "internal-secret-from-the-environment-0123456789"

    config, results = read_configuration(
        {"VKGATE_HOME": str(tmp_path), "VKGATE_INTERNAL_SECRET": override}
    )

    assert [(r.check, r.status) for r in results] == [
        ("configuration", Status.OK),
        ("proxy settings", Status.OK),
        ("control plane settings", Status.OK),
    ]
    assert f"{len(stored)} from {tmp_path / 'secrets.env'}" in results[0].detail
    assert config.proxy is not None and config.proxy.internal_secret == override
    assert (
        config.controlplane is not None
        and config.controlplane.jwt_secret == stored["VKGATE_JWT_SECRET"]
    )


def test_a_secret_only_the_control_plane_needs_is_a_warning_naming_service(
    tmp_path: Path,
) -> None:
    env = secrets_env("sqlite:///unused.db")
    del env["VKGATE_JWT_SECRET"]

    config, results = read_configuration({**env, "VKGATE_HOME": str(tmp_path)})

    by_check = {r.check: r for r in results}
    assert by_check["proxy settings"].status is Status.OK
    warned = by_check["control plane settings"]
    assert warned.status is Status.WARN
    assert warned.detail.startswith("VKGATE_JWT_SECRET is required")
    assert warned.fix is not None
    assert warned.fix.startswith(
        "if this machine runs only the proxy, check it with `vkgate doctor --service proxy`; "
        "if it runs the control plane, set VKGATE_JWT_SECRET in the environment or in "
    )
    assert config.proxy is not None and config.controlplane is None


def test_a_proxy_only_machine_names_every_control_plane_secret_it_lacks(tmp_path: Path) -> None:
    env = {"VKGATE_HOME": str(tmp_path), "VKGATE_INTERNAL_SECRET": INTERNAL_SECRET}

    _, results = read_configuration(env)

    warned = {r.check: r for r in results}["control plane settings"]
    assert warned.status is Status.WARN
    assert warned.detail == (
        "VKGATE_JWT_SECRET is required (any string of 32+ characters); also not set: "
        "VKGATE_KEY_PEPPER, VKGATE_ENCRYPTION_KEY"
    )
    assert warned.fix is not None
    assert "set VKGATE_JWT_SECRET, VKGATE_KEY_PEPPER, VKGATE_ENCRYPTION_KEY" in warned.fix


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        # Malformed, not missing: the control plane would refuse to start with it.
        ({"VKGATE_JWT_SECRET": "short"}, "VKGATE_JWT_SECRET must be at least 32 characters"),
        # Missing, but behind it a malformed value the stand-in for the secret uncovers.
        (
            {"VKGATE_JWT_SECRET": "", "VKGATE_LEDGER_URL": "ftp://ledger"},
            "VKGATE_LEDGER_URL must be http(s)://",
        ),
    ],
)
def test_a_malformed_control_plane_setting_still_fails(
    tmp_path: Path, change: dict[str, str], detail: str
) -> None:
    env = {**secrets_env("sqlite:///unused.db"), **change, "VKGATE_HOME": str(tmp_path)}

    _, results = read_configuration(env)

    failed = {r.check: r for r in results}["control plane settings"]
    assert failed.status is Status.FAIL
    assert failed.detail.startswith(detail)
    assert failed.fix is not None and failed.fix.startswith("correct VKGATE_")
    assert "--service" not in failed.fix


def test_a_secret_both_services_need_fails_both(tmp_path: Path) -> None:
    env = secrets_env("sqlite:///unused.db")
    del env["VKGATE_INTERNAL_SECRET"]

    _, results = read_configuration({**env, "VKGATE_HOME": str(tmp_path)})

    by_check = {r.check: r for r in results}
    for check in ("proxy settings", "control plane settings"):
        assert by_check[check].status is Status.FAIL
        assert by_check[check].detail.startswith("VKGATE_INTERNAL_SECRET is required")
        assert by_check[check].fix is not None
        assert by_check[check].fix.startswith("set VKGATE_INTERNAL_SECRET in the environment")


def test_service_reads_only_the_settings_of_that_service(tmp_path: Path) -> None:
    env = {**secrets_env("sqlite:///unused.db"), "VKGATE_HOME": str(tmp_path)}
    proxy_only = {"VKGATE_HOME": str(tmp_path), "VKGATE_INTERNAL_SECRET": INTERNAL_SECRET}

    proxy, on_proxy = read_configuration(proxy_only, Scope.PROXY)
    controlplane, on_controlplane = read_configuration(
        {**env, "VKGATE_PROXY_SERVER": "not-a-server"}, Scope.CONTROLPLANE
    )

    assert [(r.check, r.status, r.detail) for r in on_proxy[1:]] == [
        ("proxy settings", Status.OK, on_proxy[1].detail),
        ("control plane settings", Status.SKIP, "skipped: --service proxy"),
    ]
    assert proxy.proxy is not None and proxy.controlplane is None
    assert [(r.check, r.status, r.detail) for r in on_controlplane[1:]] == [
        ("proxy settings", Status.SKIP, "skipped: --service controlplane"),
        ("control plane settings", Status.OK, on_controlplane[2].detail),
    ]
    assert controlplane.proxy is None and controlplane.controlplane is not None


def test_an_unknown_variable_is_named_once_and_the_settings_are_still_read(
    tmp_path: Path,
) -> None:
    (tmp_path / "secrets.env").write_text("VKGATE_JWT_SECERT=x\n")
    env = {**secrets_env("sqlite:///unused.db"), "VKGATE_SPOOL_DIRECTORY": "/var/spool/vkgate"}

    config, results = read_configuration({**env, "VKGATE_HOME": str(tmp_path)})

    configuration = results[0]
    assert configuration.status is Status.FAIL
    assert (
        "VKGATE_JWT_SECERT is not a vkgate setting; did you mean VKGATE_JWT_SECRET? (in the "
        "secrets file)" in configuration.detail
    )
    assert (
        "VKGATE_SPOOL_DIRECTORY is not a vkgate setting; did you mean VKGATE_SPOOL_DIR?"
        in configuration.detail
    )
    assert configuration.fix is not None and "VKGATE_SPOOL_DIRECTORY" in configuration.fix
    assert [r.status for r in results[1:]] == [Status.OK, Status.OK]
    assert config.proxy is not None and config.controlplane is not None


def test_a_secrets_file_readable_by_others_is_a_warning_with_chmod(tmp_path: Path) -> None:
    path = tmp_path / "secrets.env"
    path.write_text("VKGATE_ADMIN_TOKEN=x\n")
    path.chmod(0o644)

    loose = check_secrets_file(path)
    path.chmod(0o600)
    private = check_secrets_file(path)

    assert loose.status is Status.WARN
    assert "mode 0644" in loose.detail
    assert loose.fix == f"chmod 600 {path}"
    assert private.status is Status.OK
    assert check_secrets_file(tmp_path / "none.env").detail.startswith("skipped: no ")


def test_a_missing_sqlite_database_fails_and_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "controlplane.db"

    result = check_database(f"sqlite:///{path}")

    assert result.status is Status.FAIL
    assert result.detail == f"sqlite file {path}: no such file"
    assert result.fix is not None and "vkgate migrate" in result.fix
    assert not path.exists()


def test_a_database_without_the_schema_fails_with_migrate(tmp_path: Path) -> None:
    path = tmp_path / "controlplane.db"
    sqlite3.connect(path).close()

    result = check_database(f"sqlite:///{path}")

    assert result.status is Status.FAIL
    assert "schema at revision none, the newest is" in result.detail
    assert result.fix is not None and "vkgate migrate" in result.fix


def test_a_migrated_database_is_ok(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'controlplane.db'}"
    upgrade(url)

    result = check_database(url)

    assert result.status is Status.OK
    assert result.detail.startswith(f"sqlite file {tmp_path / 'controlplane.db'}: reachable")


@pytest.mark.skipif(not postgres_available(), reason="no PostgreSQL at 127.0.0.1:5432")
def test_a_migrated_postgres_database_is_ok_and_only_its_host_is_shown() -> None:
    with databases.postgres_database() as url:
        upgrade(url)
        result = check_database(url)
    assert result.status is Status.OK, result
    assert result.detail.startswith("postgresql at 127.0.0.1:5432: reachable, schema current")
    assert "vkgate_test_" not in result.detail  # not the URL: only the dialect and host


def test_an_unreachable_postgres_fails_without_showing_its_password() -> None:
    port = closed_port()
    url = f"postgresql+psycopg://vkgate:{PASSWORD}@127.0.0.1:{port}/vkgate"

    result = check_database(url)

    assert result.status is Status.FAIL
    assert result.detail.startswith(f"postgresql at 127.0.0.1:{port}: cannot connect (")
    assert PASSWORD not in result.detail and "vkgate:" not in result.detail


def test_a_database_url_that_does_not_parse_fails_without_showing_it() -> None:
    url = f"postgresql+psycopg://vkgate:{PASSWORD}@127.0.0.1:not-a-port/vkgate"

    result = check_database(url)

    assert result.status is Status.FAIL
    assert result.detail == "VKGATE_DATABASE_URL is not a URL this can read"
    assert result.fix is not None and "postgresql+psycopg://user:password@" in result.fix
    assert PASSWORD not in result.detail + result.fix


def test_a_database_driver_not_installed_fails_without_showing_the_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` raises ImportError
    port = closed_port()

    result = check_database(f"postgresql+psycopg://vkgate:{PASSWORD}@127.0.0.1:{port}/vkgate")

    assert result.status is Status.FAIL
    assert result.detail.startswith(f"postgresql at 127.0.0.1:{port}: cannot open (")
    assert "psycopg" in result.detail
    assert result.fix is not None and "database driver" in result.fix
    assert PASSWORD not in result.detail and "vkgate:" not in result.detail


@pytest.mark.skipif(not redis_available(), reason=f"no Redis at {REDIS_URL}")
def test_a_reachable_redis_answers_ping() -> None:
    result = check_redis(REDIS_URL)
    assert result.status is Status.OK
    assert result.detail.startswith("redis at 127.0.0.1:6379 answered PING")


def test_an_unreachable_redis_fails_fast_without_showing_its_url() -> None:
    port = closed_port()
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    started = time.monotonic()

    result = check_redis(url)

    assert time.monotonic() - started < 5
    assert result.status is Status.FAIL
    assert result.detail.startswith(f"redis at 127.0.0.1:{port}: no answer to PING")
    assert PASSWORD not in result.detail and "redis://" not in result.detail
    assert check_redis(None).detail.startswith("skipped: VKGATE_REDIS_URL is not set")


def test_a_spool_path_under_a_regular_file_fails(tmp_path: Path) -> None:
    regular = tmp_path / "a-file"
    regular.write_text("")

    under = check_spool_directory(regular / "spool")
    itself = check_spool_directory(regular)

    assert under.status is Status.FAIL
    assert under.detail == f"{regular / 'spool'} cannot be created: {regular} is not a directory"
    assert itself.status is Status.FAIL
    assert itself.detail == f"{regular} is not a directory"
    assert under.fix is not None and "VKGATE_SPOOL_DIR" in under.fix


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a read-only directory anyway")
def test_a_read_only_spool_directory_fails(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o500)
    try:
        result = check_spool_directory(spool)
    finally:
        spool.chmod(0o700)
    assert result.status is Status.FAIL
    assert "is not writable" in result.detail


def test_a_writable_spool_is_ok_and_left_as_it_was(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()

    assert check_spool_directory(spool).status is Status.OK
    assert list(spool.iterdir()) == []
    missing = check_spool_directory(tmp_path / "not-yet")
    assert missing.status is Status.OK
    assert "the proxy will create it" in missing.detail
    assert not (tmp_path / "not-yet").exists()


def refuse_search_under(monkeypatch: pytest.MonkeyPatch, locked: Path) -> None:
    """`stat` of anything under `locked` fails EACCES, as when a directory above it refuses this
    user a search: then Python 3.11's `exists()` and `is_dir()` raise (root is never refused,
    so a chmod would not show it when the tests run as root)."""
    original = Path.stat

    def stat(self: Path, *, follow_symlinks: bool = True) -> os.stat_result:
        if self.is_relative_to(locked):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return original(self, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(Path, "stat", stat)


def test_a_spool_this_user_cannot_look_at_fails_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    refuse_search_under(monkeypatch, locked)

    inside = check_spool_directory(locked / "spool")
    space = check_spool_space(locked / "spool", 1024**2, Backlog())

    assert inside.status is Status.FAIL
    assert inside.detail == f"cannot look at {locked / 'spool'}: Permission denied"
    assert inside.fix is not None and "VKGATE_SPOOL_DIR" in inside.fix
    assert space.status is Status.FAIL
    assert space.detail == f"cannot look at {locked / 'spool'}: Permission denied"


@pytest.mark.skipif(os.geteuid() == 0, reason="root searches a directory without x anyway")
def test_a_spool_under_a_directory_without_search_fails(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o600)
    try:
        result = check_spool_directory(locked / "spool")
    finally:
        locked.chmod(0o700)
    assert result.status is Status.FAIL
    assert result.detail.startswith(f"cannot look at {locked / 'spool'}: Permission denied")


def test_free_space_that_cannot_be_read_fails_naming_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_usage(path: Path) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)

    result = check_spool_space(tmp_path / "spool", 1024**2, Backlog())

    assert result.status is Status.FAIL
    assert result.detail == f"cannot look at {tmp_path / 'spool'}: Permission denied at {tmp_path}"


def test_a_spool_that_cannot_be_listed_is_an_unknown_backlog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def iterdir(self: Path) -> Iterator[Path]:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))

    monkeypatch.setattr(Path, "iterdir", iterdir)

    backlog = survey_spool(tmp_path, time.time())
    result = check_spool_backlog(backlog)

    assert result.status is Status.WARN
    assert result.detail.startswith(f"cannot read {tmp_path} (Permission denied)")


def _segments(replica: Path, count: int, *, size: int = 100, age_s: float = 0.0) -> None:
    replica.mkdir(parents=True, exist_ok=True)
    at = time.time() - age_s
    for n in range(1, count + 1):
        path = replica / f"{n:020d}.seg"
        path.write_bytes(b"x" * size)
        os.utime(path, (at, at))


def test_the_backlog_counts_sealed_segments_only(tmp_path: Path) -> None:
    _segments(tmp_path / "replica-a", 3, size=1000)
    (tmp_path / "replica-a" / "00000000000000000004.open").write_bytes(b"y" * 50)
    (tmp_path / "replica-a" / "lock").write_text("1\n")
    (tmp_path / "replica-a" / "seq").write_text("3\n")

    backlog = survey_spool(tmp_path, time.time())
    result = check_spool_backlog(backlog)

    assert (backlog.segments, backlog.bytes, backlog.rejected) == (3, 3000, 0)
    assert result.status is Status.OK
    assert result.detail.startswith("3 sealed segment(s) (2.9 KiB) waiting to ship")


def test_a_long_or_old_backlog_is_a_warning_about_the_control_plane(tmp_path: Path) -> None:
    _segments(tmp_path / "long" / "replica-a", 101)
    _segments(tmp_path / "old" / "replica-a", 1, age_s=600)

    long = check_spool_backlog(survey_spool(tmp_path / "long", time.time()))
    old = check_spool_backlog(survey_spool(tmp_path / "old", time.time()))

    for result in (long, old):
        assert result.status is Status.WARN
        assert result.fix is not None
        assert result.fix.startswith("is the control plane reachable from the proxy?")
        assert "vkgate_spool_" in result.fix
    assert "101 sealed segment(s)" in long.detail
    assert re.search(r"oldest (59\d|60\d) s", old.detail), old.detail


def test_rejected_segments_are_a_warning(tmp_path: Path) -> None:
    (tmp_path / "replica-a" / "rejected").mkdir(parents=True)
    (tmp_path / "replica-a" / "rejected" / "00000000000000000001.seg").write_text("bad\n")

    result = check_spool_backlog(survey_spool(tmp_path, time.time()))

    assert result.status is Status.WARN
    assert "1 refused by the control plane" in result.detail


def test_less_free_disk_than_the_spool_bound_is_a_warning(tmp_path: Path) -> None:
    huge = 2**62
    short = check_spool_space(tmp_path, huge, Backlog())
    roomy = check_spool_space(tmp_path, 1024**2, Backlog())

    assert short.status is Status.WARN
    assert short.fix is not None and "VKGATE_SPEND_SPOOL_MAX_BYTES" in short.fix
    assert roomy.status is Status.OK


@pytest.mark.parametrize(
    ("host", "port", "token", "status"),
    [
        ("127.0.0.1", 9464, None, Status.OK),
        ("::1", 9464, None, Status.OK),
        ("localhost", 9464, None, Status.OK),
        ("127.0.0.1", None, None, Status.OK),
        ("0.0.0.0", 9464, "metrics-token", Status.OK),
        ("0.0.0.0", 9464, None, Status.WARN),
        ("10.1.2.3", 9464, None, Status.WARN),
    ],
)
def test_metrics_open_to_other_machines_without_a_token_is_a_warning(
    host: str, port: int | None, token: str | None, status: Status
) -> None:
    result = check_metrics_address(host, port, token)
    assert result.status is status
    if status is Status.WARN:
        assert result.fix is not None and "VKGATE_METRICS_TOKEN" in result.fix


def test_a_health_time_without_a_timezone_is_taken_as_utc() -> None:
    now = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    naive = (now + timedelta(seconds=90)).replace(tzinfo=None).isoformat()

    def health(request: httpx.Request) -> httpx.Response:
        body = {"status": "ok", "revision": 7, "time": naive, "version": VERSION}
        return httpx.Response(200, json=body)

    transport = httpx.MockTransport(health)
    with httpx.Client(base_url="http://controlplane", transport=transport) as http:
        result = check_internal_api(http, INTERNAL_SECRET, ManualClock(now))

    assert result.status is Status.WARN
    assert f"revision 7, version {VERSION}, clocks 90 s apart" in result.detail


def controlplane_knowing(secret: str, version: str = VERSION) -> httpx.MockTransport:
    """A control plane's internal health route that takes signatures made with `secret`."""
    now = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)

    def health(request: httpx.Request) -> httpx.Response:
        problem = signing.verify(
            secret,
            request.method,
            request.url.raw_path.decode(),
            request.content,
            request.headers.get(signing.TIMESTAMP_HEADER),
            request.headers.get(signing.SIGNATURE_HEADER),
            now.timestamp(),
        )
        if problem is not None:
            error = {"message": "refused", "type": "authentication_error", "code": "bad_signature"}
            return httpx.Response(401, json={"error": error})
        body = {"status": "ok", "revision": 7, "time": now.isoformat(), "version": version}
        return httpx.Response(200, json=body)

    return httpx.MockTransport(health)


def test_a_control_plane_that_takes_only_the_previous_internal_secret_is_a_warning() -> None:
    old, new = INTERNAL_SECRET, "new-internal-secret-0123456789abcdef01"
    clock = ManualClock(datetime(2026, 3, 10, 12, 0, tzinfo=UTC))
    with httpx.Client(base_url="http://cp", transport=controlplane_knowing(old)) as http:
        behind = check_internal_api(http, new, clock, previous=old)
        without_previous = check_internal_api(http, new, clock)
    assert behind.status is Status.WARN
    assert "only with VKGATE_INTERNAL_SECRET_PREVIOUS" in behind.detail
    assert behind.fix is not None and "every control plane the new VKGATE_INTERNAL_SECRET" in (
        behind.fix
    )
    assert without_previous.status is Status.FAIL
    with httpx.Client(base_url="http://cp", transport=controlplane_knowing(new)) as http:
        assert check_internal_api(http, new, clock, previous=old).status is Status.OK


@pytest.mark.parametrize(
    ("theirs", "status"), [("0.2.5", Status.OK), ("0.3.0", Status.FAIL), ("1.1.0", Status.FAIL)]
)
def test_doctor_names_a_control_plane_more_than_one_minor_version_away(
    theirs: str, status: Status, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("vkgate.__version__", "0.1.0")
    clock = ManualClock(datetime(2026, 3, 10, 12, 0, tzinfo=UTC))
    transport = controlplane_knowing(INTERNAL_SECRET, version=theirs)
    with httpx.Client(base_url="http://cp", transport=transport) as http:
        result = check_internal_api(http, INTERNAL_SECRET, clock)
    assert result.status is status
    if status is Status.FAIL:
        assert f"proxy 0.1.0 and control plane {theirs} are more than 1 minor version apart" in (
            result.detail
        )
        assert result.fix is not None and "one minor version at a time" in result.fix


def test_a_check_that_raises_is_its_own_fail_and_the_others_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `vkgate.cli.doctor` as an attribute of `vkgate.cli` is the click command, not the module.
    module = importlib.import_module("vkgate.cli.doctor")

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"went wrong near {INTERNAL_SECRET}")

    for check in ("check_controlplane", "check_spool_directory", "survey_spool"):
        monkeypatch.setattr(module, check, broken)
    env = {
        **secrets_env(f"sqlite:///{tmp_path / 'controlplane.db'}"),
        "VKGATE_HOME": str(tmp_path),
        "VKGATE_METRICS_ADDR": "off",
    }

    results = {r.check: r for r in module.run_checks(env)}

    assert list(results) == [
        "configuration",
        "proxy settings",
        "control plane settings",
        "secrets file",
        "control plane",
        "internal API",
        "database",
        "ledger",
        "redis",
        "spool directory",
        "spool disk space",
        "spool backlog",
        "metrics address",
    ]
    for check in ("control plane", "spool directory", "spool backlog"):
        assert results[check].status is Status.FAIL
        # No secret is printed, not even one an exception quotes.
        assert results[check].detail == (
            "doctor could not complete this check: RuntimeError: went wrong near ***"
        )
    assert results["internal API"].status is Status.SKIP
    assert results["spool disk space"].status in (Status.OK, Status.WARN)
    assert results["metrics address"].status is Status.OK
    assert results["database"].detail.endswith("no such file")


# --- against a running control plane ----------------------------------------------------------


@pytest.fixture(scope="module")
def controlplane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Path]]:
    """`vkgate controlplane` on SQLite and embedded chDB, and its VKGATE_HOME."""
    home = tmp_path_factory.mktemp("doctor-controlplane")
    with sqlite_controlplane(home) as service:
        yield service, home


@pytest.fixture
def machine(controlplane: tuple[Service, Path], tmp_path: Path) -> dict[str, str]:
    """The environment of a machine that runs vkgate with that control plane: the secrets in
    VKGATE_HOME/secrets.env (mode 0600), the stores the control plane's."""
    service, home = controlplane
    stored = secrets_env(f"sqlite:///{home / 'controlplane.db'}")
    secrets = tmp_path / "secrets.env"
    secrets.write_text("".join(f"{k}={v}\n" for k, v in stored.items()))
    secrets.chmod(0o600)
    env = clean_env(
        VKGATE_HOME=str(tmp_path),
        VKGATE_CONTROLPLANE_URL=service.url,
        VKGATE_LEDGER_URL=f"chdb://{home / 'ledger'}",
    )
    if redis_available():
        env["VKGATE_REDIS_URL"] = REDIS_URL
    return env


def doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return vkgate("doctor", *args, env=env, cwd=Path(env["VKGATE_HOME"]))


def checks(env: dict[str, str], *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """`vkgate doctor --json`: its exit status and its checks by name."""
    result = doctor(env, "--json", *args)
    assert "Traceback" not in result.stderr, result.stderr
    answer = json.loads(result.stdout)
    assert all(set(item) == {"check", "status", "detail", "fix"} for item in answer)
    return result.returncode, {item["check"]: item for item in answer}


def test_a_healthy_machine_passes_every_check(machine: dict[str, str]) -> None:
    status, found = checks(machine)

    assert status == 0, found
    assert {name: item["status"] for name, item in found.items()} == {
        "configuration": "ok",
        "proxy settings": "ok",
        "control plane settings": "ok",
        "secrets file": "ok",
        "control plane": "ok",
        "internal API": "ok",
        "database": "ok",
        # The running control plane has the embedded ledger open.
        "ledger": "skip",
        "redis": "ok" if "VKGATE_REDIS_URL" in machine else "skip",
        "spool directory": "ok",
        "spool disk space": found["spool disk space"]["status"],  # this machine's disk
        "spool backlog": "ok",
        "metrics address": "ok",
    }
    assert found["ledger"]["detail"].startswith(
        "skipped: checked through the control plane's /readyz"
    )
    assert "status=ok" in found["control plane"]["detail"]
    assert found["internal API"]["detail"].startswith("signed round trip ok: revision ")
    assert found["spool disk space"]["status"] in ("ok", "warn")


def test_the_report_is_one_line_per_check_and_a_fix_under_each_problem(
    machine: dict[str, str],
) -> None:
    machine["VKGATE_METRICS_ADDR"] = "0.0.0.0:9464"  # a warning, with its fix

    result = doctor(machine)

    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert re.fullmatch(r"ok    configuration +\d+ VKGATE_\* settings \(6 from .+\)", lines[0])
    assert re.fullmatch(r"ok    internal API +signed round trip ok: .+", lines[5])
    warning = lines.index(next(line for line in lines if line.startswith("warn  metrics")))
    assert lines[warning + 1].strip().startswith("fix: set VKGATE_METRICS_TOKEN")
    assert re.fullmatch(r"\d+ ok, [1-9]\d* warn, 0 FAIL, \d+ skipped", lines[-1])


def test_a_wrong_internal_secret_fails_the_signed_call_with_cause_signature(
    machine: dict[str, str],
) -> None:
    machine["VKGATE_INTERNAL_SECRET"] = "not-the-control-planes-secret-0123456789"

    status, found = checks(machine)

    assert status == 1
    failed = {name for name, item in found.items() if item["status"] == "fail"}
    assert failed == {"internal API"}
    detail = found["internal API"]["detail"]
    assert ": signature: the control plane refused the signature" in detail
    assert "VKGATE_INTERNAL_SECRET" in detail and "300 s" in detail
    assert "same VKGATE_INTERNAL_SECRET" in found["internal API"]["fix"]
    assert "not-the-control-planes-secret" not in json.dumps(found)


def test_a_clock_out_of_step_is_refused_or_warned(controlplane: tuple[Service, Path]) -> None:
    service, _ = controlplane
    now = datetime.now(UTC)
    with httpx.Client(base_url=service.url, timeout=5) as http:
        refused = check_internal_api(
            http, INTERNAL_SECRET, ManualClock(now + timedelta(seconds=600))
        )
        drifting = check_internal_api(
            http, INTERNAL_SECRET, ManualClock(now - timedelta(seconds=120))
        )
        fine = check_internal_api(http, INTERNAL_SECRET, SystemClock())

    assert refused.status is Status.FAIL
    assert "signature refused: skew" in refused.detail
    assert refused.detail.index("300 s") < refused.detail.index("VKGATE_INTERNAL_SECRET")
    assert drifting.status is Status.WARN
    assert re.search(r"clocks 1[12]\d s apart", drifting.detail), drifting.detail
    assert fine.status is Status.OK


def test_a_control_plane_that_is_not_running_is_a_connect_failure(tmp_path: Path) -> None:
    port = closed_port()
    env = clean_env(
        **secrets_env(f"sqlite:///{tmp_path / 'controlplane.db'}"),
        VKGATE_HOME=str(tmp_path),
        VKGATE_CONTROLPLANE_URL=f"http://127.0.0.1:{port}",
    )
    migrated = vkgate("migrate", env=env, cwd=tmp_path)
    assert migrated.returncode == 0, migrated.stderr

    status, found = checks(env)

    assert status == 1
    reached = found["control plane"]
    assert reached["status"] == "fail"
    assert reached["detail"] == (
        f"http://127.0.0.1:{port}: connect: nothing accepts connections at 127.0.0.1:{port} "
        "(connection refused)"
    )
    assert "vkgate controlplane" in reached["fix"]
    assert (
        found["internal API"]["detail"] == "skipped: the control plane did not answer (see above)"
    )
    # Nothing holds the embedded ledger: it is opened and checked directly.
    assert found["ledger"]["status"] == "ok", found["ledger"]
    assert found["database"]["status"] == "ok"


def test_an_unknown_variable_fails_the_configuration_naming_it(machine: dict[str, str]) -> None:
    machine["VKGATE_REDIS_URI"] = "redis://127.0.0.1:6379/0"

    status, found = checks(machine)

    assert status == 1
    assert found["configuration"]["status"] == "fail"
    assert found["configuration"]["detail"] == (
        "VKGATE_REDIS_URI is not a vkgate setting; did you mean VKGATE_REDIS_URL?"
    )
    assert found["internal API"]["status"] == "ok"  # everything else was still checked


def test_a_spool_that_cannot_be_a_directory_fails(machine: dict[str, str], tmp_path: Path) -> None:
    regular = tmp_path / "not-a-directory"
    regular.write_text("")
    machine["VKGATE_SPOOL_DIR"] = str(regular / "spool")

    status, found = checks(machine)

    assert status == 1
    assert found["spool directory"]["status"] == "fail"
    assert found["spool directory"]["detail"].endswith(f"{regular} is not a directory")


def test_an_unreachable_redis_fails_without_printing_its_url(machine: dict[str, str]) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{closed_port()}/0"
    machine["VKGATE_REDIS_URL"] = url

    text = doctor(machine)
    status, found = checks(machine)

    assert text.returncode == status == 1
    assert found["redis"]["status"] == "fail"
    for output in (text.stdout + text.stderr, json.dumps(found)):
        assert PASSWORD not in output and url not in output


def test_a_proxy_only_machine_passes_and_service_proxy_skips_the_control_planes_checks(
    controlplane: tuple[Service, Path], tmp_path: Path
) -> None:
    service, _ = controlplane
    env = clean_env(
        VKGATE_HOME=str(tmp_path),
        VKGATE_CONTROLPLANE_URL=service.url,
        VKGATE_INTERNAL_SECRET=INTERNAL_SECRET,
    )

    every, found = checks(env)
    status, only = checks(env, "--service", "proxy")

    assert every == 0, found
    assert found["control plane settings"]["status"] == "warn"
    assert "`vkgate doctor --service proxy`" in found["control plane settings"]["fix"]
    assert status == 0, only
    for check in ("control plane settings", "database", "ledger"):
        assert only[check]["detail"] == "skipped: --service proxy"
    assert only["proxy settings"]["status"] == "ok"
    assert only["internal API"]["status"] == "ok"
    assert only["spool directory"]["status"] == "ok"


def test_doctor_reaches_the_control_plane_the_way_the_proxy_does_through_its_egress(
    controlplane: tuple[Service, Path], tmp_path: Path
) -> None:
    service, _ = controlplane
    nothing_there = f"http://127.0.0.1:{free_port()}"
    env = clean_env(
        VKGATE_HOME=str(tmp_path),
        VKGATE_CONTROLPLANE_URL=service.url,
        VKGATE_INTERNAL_SECRET=INTERNAL_SECRET,
        # An egress proxy that is down: the proxy calls its control plane on loopback
        # directly, and so does doctor (httpx's own reading of these would not).
        HTTP_PROXY=nothing_there,
        HTTPS_PROXY=nothing_there,
    )

    status, found = checks(env, "--service", "proxy")

    assert status == 0, found
    assert found["control plane"]["status"] == "ok"
    assert found["internal API"]["status"] == "ok"


def test_service_controlplane_skips_the_proxys_checks_and_signs_with_its_own_secret(
    machine: dict[str, str],
) -> None:
    machine["VKGATE_PROXY_SERVER"] = "not-a-server"  # malformed: the proxy would not start

    every, found = checks(machine)
    status, only = checks(machine, "--service", "controlplane")
    refused = doctor(machine, "--service", "both")

    assert every == 1
    assert found["proxy settings"]["status"] == "fail"
    assert status == 0, only
    for check in (
        "proxy settings",
        "redis",
        "spool directory",
        "spool disk space",
        "spool backlog",
        "metrics address",
    ):
        assert only[check]["detail"].startswith("skipped: --service controlplane"), only[check]
    assert only["control plane settings"]["status"] == "ok"
    assert only["internal API"]["status"] == "ok"
    assert only["database"]["status"] == "ok"
    assert refused.returncode == 2
    assert "'both' is not one of 'proxy', 'controlplane', 'all'" in refused.stderr


def test_a_control_plane_without_its_ledger_is_a_warning_not_a_failure() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":
            return httpx.Response(200, json={"status": "ok"})
        body = {"status": "degraded", "database": "ok", "ledger": "timeout"}
        return httpx.Response(200, json=body)

    with httpx.Client(base_url="http://cp.test", transport=httpx.MockTransport(answer)) as http:
        result, up = check_controlplane(http)
    assert up
    assert result.status is Status.WARN
    assert "ledger=timeout" in result.detail
    assert result.fix is not None and "VKGATE_LEDGER_URL" in result.fix


def test_several_workers_are_named_as_why_there_is_no_metrics_listener() -> None:
    result = check_metrics_address("127.0.0.1", None, None, workers=2)
    assert result.status is Status.OK
    assert result.detail == "off (2 proxy workers serve no metrics)"


def test_a_short_url_password_is_not_masked_everywhere_it_happens_to_appear() -> None:
    env = {
        "VKGATE_DATABASE_URL": "postgresql+psycopg://postgres:postgres@localhost/vkgate",
        "VKGATE_REDIS_URL": "redis://:a-long-redis-password@localhost:6379/0",
    }
    assert secret_values(env) == set()
    quoted = Result(
        "database",
        Status.FAIL,
        "postgresql at localhost: cannot open postgresql+psycopg://postgres:postgres@db/vkgate",
    )
    shown = redacted(quoted, secret_values(env))
    assert shown.detail == "postgresql at localhost: cannot open postgresql+psycopg://db/vkgate"
