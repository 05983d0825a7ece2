"""`vkgate up`, `vkgate controlplane` and `vkgate migrate` as processes: start-up and refusals."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import httpx
import pytest

from tests.support.env import secrets_env
from tests.support.processes import banner_value, clean_env, free_port, running, vkgate

GENERATED_SECRETS = {
    "VKGATE_INTERNAL_SECRET",
    "VKGATE_JWT_SECRET",
    "VKGATE_KEY_PEPPER",
    "VKGATE_ENCRYPTION_KEY",
    "VKGATE_ADMIN_TOKEN",
}


def read_secrets(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def test_up_generates_private_secrets_and_reuses_them_on_restart(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(
        VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{port}", VKGATE_PROXY_ADDR=f"127.0.0.1:{free_port()}"
    )
    secrets_file = tmp_path / ".vkgate" / "secrets.env"

    with running(["up"], env=env, port=port, log=tmp_path / "up-1.log", cwd=tmp_path) as first:
        output = first.output()
        assert banner_value(output, "control plane") == f"http://127.0.0.1:{port}"
        token = banner_value(output, "admin token")

        assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
        stored = read_secrets(secrets_file)
        assert set(stored) == GENERATED_SECRETS
        assert stored["VKGATE_ADMIN_TOKEN"] == token
        assert len(base64.urlsafe_b64decode(stored["VKGATE_ENCRYPTION_KEY"])) == 32
        assert all(len(value) >= 32 for value in stored.values())
        assert (tmp_path / ".vkgate" / "controlplane.db").exists()

        # The printed token is an admin token of the running control plane.
        bearer = {"Authorization": f"Bearer {token}"}
        created = httpx.post(
            f"{first.url}/api/admin/organizations", json={"name": "acme"}, headers=bearer
        )
        assert created.status_code == 201, created.text
        wrong = {"Authorization": "Bearer vka-not-the-token-0123456789abcdef"}
        assert httpx.get(f"{first.url}/api/admin/organizations", headers=wrong).status_code == 401

        # The CLI in the same directory finds the control plane and the token on its own.
        listed = vkgate("orgs", "list", "--json", env=env, cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr
        assert [org["name"] for org in json.loads(listed.stdout)] == ["acme"]
    secrets_text = secrets_file.read_text()

    with running(["up"], env=env, port=port, log=tmp_path / "up-2.log", cwd=tmp_path) as second:
        assert banner_value(second.output(), "admin token") == token
        assert secrets_file.read_text() == secrets_text
        listed = vkgate("orgs", "list", "--json", env=env, cwd=tmp_path)
        assert [org["name"] for org in json.loads(listed.stdout)] == ["acme"]


def _with(changes: dict[str, str | None]) -> dict[str, str]:
    """The test secrets with some replaced (a value) or removed (None)."""
    base: dict[str, str] = secrets_env("sqlite:///unused.db")
    for name, value in changes.items():
        if value is None:
            base.pop(name, None)
        else:
            base[name] = value
    return base


SIXTEEN_BYTES = base64.urlsafe_b64encode(bytes(16)).decode()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"VKGATE_INTERNAL_SECRET": None}, "VKGATE_INTERNAL_SECRET is required"),
        ({"VKGATE_JWT_SECRET": None}, "VKGATE_JWT_SECRET is required"),
        ({"VKGATE_KEY_PEPPER": "short"}, "VKGATE_KEY_PEPPER must be at least 32 characters"),
        ({"VKGATE_ENCRYPTION_KEY": None}, "VKGATE_ENCRYPTION_KEY is required"),
        (
            {"VKGATE_ENCRYPTION_KEY": SIXTEEN_BYTES},
            "VKGATE_ENCRYPTION_KEY must decode to exactly 32 bytes, got 16",
        ),
        ({"VKGATE_ADMIN_TOKEN": "too-short"}, "VKGATE_ADMIN_TOKEN must be at least 32"),
        (
            {"VKGATE_DATABASE_URL": None, "VKGATE_DATABSE_URL": "sqlite:///typo.db"},
            "VKGATE_DATABSE_URL is not a vkgate setting; did you mean VKGATE_DATABASE_URL?",
        ),
        ({"VKGATE_DATABASE_URL": "mysql://db/vkgate"}, "VKGATE_DATABASE_URL must be a"),
        ({"VKGATE_LOG_LEVEL": "chatty"}, "VKGATE_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR"),
    ],
    ids=[
        "internal-secret-missing",
        "jwt-secret-missing",
        "key-pepper-too-short",
        "encryption-key-missing",
        "encryption-key-16-bytes",
        "admin-token-too-short",
        "database-url-typo",
        "database-url-scheme",
        "log-level",
    ],
)
def test_controlplane_refuses_to_start_on_a_bad_setting(
    changes: dict[str, str | None], message: str, tmp_path: Path
) -> None:
    env = clean_env(
        **_with(changes),
        VKGATE_HOME=str(tmp_path),
        VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{free_port()}",
    )
    result = vkgate("controlplane", env=env, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"configuration: {message}" in result.stderr
    assert "Traceback" not in result.stderr


def test_controlplane_refuses_a_bad_listen_address(tmp_path: Path) -> None:
    env = clean_env(
        **secrets_env(f"sqlite:///{tmp_path / 'cp.db'}"),
        VKGATE_CONTROLPLANE_ADDR="127.0.0.1:70000",
    )
    result = vkgate("controlplane", "--migrate", env=env, cwd=tmp_path)
    assert result.returncode == 1
    assert "VKGATE_CONTROLPLANE_ADDR port must be 0-65535, got 70000" in result.stderr


def test_migrate_refuses_an_unknown_setting(tmp_path: Path) -> None:
    env = clean_env(VKGATE_HOME=str(tmp_path), VKGATE_DATABSE_URL="sqlite:///typo.db")
    result = vkgate("migrate", env=env, cwd=tmp_path)
    assert result.returncode == 1
    assert "did you mean VKGATE_DATABASE_URL?" in result.stderr
    assert not (tmp_path / "controlplane.db").exists()


@pytest.mark.parametrize(
    "where",
    ["existing-directory", "new-directory"],
)
def test_controlplane_refuses_an_unmigrated_database_until_vkgate_migrate(
    where: str, tmp_path: Path
) -> None:
    directory = tmp_path if where == "existing-directory" else tmp_path / "not" / "yet"
    port = free_port()
    env = clean_env(
        **secrets_env(f"sqlite:///{directory / 'controlplane.db'}"),
        VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{port}",
        # Where the embedded ledger lives, whichever directory each command runs in.
        VKGATE_HOME=str(tmp_path),
    )
    refused = vkgate("controlplane", env=env, cwd=tmp_path)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "vkgate migrate" in refused.stderr
    assert "Traceback" not in refused.stderr

    migrated = vkgate("migrate", env=env, cwd=tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    assert "migrations applied" in migrated.stdout

    with running(["controlplane"], env=env, port=port, log=tmp_path / "cp.log") as service:
        ready = httpx.get(f"{service.url}/readyz")
        assert ready.status_code == 200
        assert ready.json() == {"status": "ok", "database": "ok", "ledger": "ok"}
