"""The production install: no chDB (a ClickHouse server keeps the ledger), as the image has it.

No container engine runs here, so the image is not built: these tests run vkgate in a Python
that cannot import chDB, and check the Dockerfile against the package and the chart.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import yaml

from controlplane.migrate import upgrade
from tests.deploy.chart import CHART_DIR
from tests.support.env import secrets_env

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60

# Makes `import chdb` fail as on a machine without it, before anything else is imported.
WITHOUT_CHDB = "import sys; sys.modules['chdb'] = None\n"
CLI_WITHOUT_CHDB = WITHOUT_CHDB + "from vkgate.cli import main; main(prog_name='vkgate')"


def run_python(
    code: str, *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_chdb_is_an_extra_that_development_installs_still_get() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("chdb")]
    extras = project["optional-dependencies"]
    assert [d for d in extras["embedded"] if d.startswith("chdb")]
    assert [d for d in extras["dev"] if d.startswith("chdb")]


def test_the_control_plane_starts_without_chdb_on_a_clickhouse_ledger(tmp_path: Path) -> None:
    code = WITHOUT_CHDB + textwrap.dedent(
        f"""
        from controlplane.app import create_app
        from controlplane.ledger.client import LedgerError, connect
        from controlplane.ledger.store import Ledger
        from controlplane.settings import ControlPlaneSettings

        env = {secrets_env(f"sqlite:///{tmp_path / 'cp.db'}")!r}
        served = ControlPlaneSettings.from_env(
            env | {{"VKGATE_LEDGER_URL": "http://default@127.0.0.1:9/vkgate"}}
        )
        create_app(served)
        Ledger(served.ledger)

        embedded = ControlPlaneSettings.from_env(env | {{"VKGATE_HOME": {str(tmp_path)!r}}})
        for attempt in (lambda: create_app(embedded), lambda: connect(embedded.ledger)):
            try:
                attempt()
            except LedgerError as exc:
                print(exc)
            else:
                raise SystemExit("an embedded ledger was accepted without chDB")
        assert sys.modules["chdb"] is None
        """
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    messages = result.stdout.splitlines()
    assert len(messages) == 2
    for message in messages:
        assert f"chdb://{tmp_path / 'ledger'}" in message
        assert "VKGATE_LEDGER_URL" in message
        assert "pip install 'vkgate[embedded]'" in message


def test_vkgate_migrate_and_controlplane_refuse_a_chdb_ledger_without_chdb(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    # A current database: the control plane gets as far as the ledger, and its refusal must
    # say chDB is missing, not that a migration is.
    upgrade(url)
    env = {
        "PATH": "/usr/bin:/bin",
        **secrets_env(url),
        "VKGATE_LEDGER_URL": f"chdb://{tmp_path / 'ledger'}",
    }
    commands = ("migrate", "controlplane")
    running = [
        subprocess.Popen(
            [sys.executable, "-c", CLI_WITHOUT_CHDB, command],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    for command, process in zip(commands, running, strict=True):
        _, stderr = process.communicate(timeout=TIMEOUT_S)
        assert process.returncode == 1, (command, stderr)
        assert "Traceback" not in stderr
        assert "VKGATE_LEDGER_URL" in stderr
        assert "pip install 'vkgate[embedded]'" in stderr
        assert "not at the newest schema" not in stderr
    assert not (tmp_path / "ledger").exists()


def dockerfile_stages() -> dict[str, list[str]]:
    """Instructions per stage, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            current = stages.setdefault(line.split()[-1], [])
        current.append(line)
    return stages


def test_the_image_runs_vkgate_as_the_non_root_user_the_chart_expects() -> None:
    runtime = dockerfile_stages()["runtime"]
    (user,) = [line.split()[1] for line in runtime if line.startswith("USER ")]
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    security = values["podSecurity"]
    assert user == f"{security['runAsUser']}:{security['runAsGroup']}"
    assert 'ENTRYPOINT ["vkgate"]' in runtime


def test_the_image_installs_every_package_and_no_embedded_ledger() -> None:
    build = dockerfile_stages()["build"]
    installs = [line for line in build if "pip install" in line]
    assert installs
    assert not any("embedded" in line or "chdb" in line for line in installs)
    (lock,) = [line for line in build if line.startswith("ARG VKGATE_LOCK=")]
    assert lock.partition("=")[2] == "image.txt", "the image installs the production lock"
    assert [line for line in installs if "--require-hashes" in line]
    assert [line for line in installs if "--no-deps --no-build-isolation ." in line]
    copied = {
        line.split()[1] for line in build if line.startswith("COPY ") and "--from" not in line
    }
    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"][
        "find"
    ]["include"]
    assert {pattern.rstrip("*") for pattern in wanted} <= copied
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignored
    for package in {pattern.rstrip("*") for pattern in wanted} | {
        "pyproject.toml",
        "README.md",
        "requirements",
    }:
        assert f"!{package}/" in ignored or f"!{package}" in ignored, package


def test_doctor_names_the_missing_chdb_instead_of_a_migration_or_a_lock(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    upgrade(url)
    (tmp_path / "ledger").mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        **secrets_env(url),
        "VKGATE_HOME": str(tmp_path),
        "VKGATE_CONTROLPLANE_URL": "http://127.0.0.1:9",
        "VKGATE_LEDGER_URL": f"chdb://{tmp_path / 'ledger'}",
    }
    result = run_python(CLI_WITHOUT_CHDB, "doctor", "--json", env=env, cwd=tmp_path)
    assert "Traceback" not in result.stderr, result.stderr
    (ledger,) = [check for check in json.loads(result.stdout) if check["check"] == "ledger"]
    assert ledger["status"] == "fail"
    assert "pip install 'vkgate[embedded]'" in ledger["detail"]
    assert ledger["fix"] is None
