"""Settings: the `VKGATE_*` parsers, the control plane's settings, and where the CLI looks."""

from __future__ import annotations

import base64
import re
import stat
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from controlplane.settings import ControlPlaneSettings
from tests.support.env import ADMIN_TOKEN, ENCRYPTION_KEY, KEY_PEPPER, secrets_env
from vkgate import env as E
from vkgate.cli._client import default_token, default_url
from vkgate.cli.serve import GENERATED, ensure_secrets


def refused(message: str) -> AbstractContextManager[pytest.ExceptionInfo[E.SettingError]]:
    return pytest.raises(E.SettingError, match=re.escape(message))


class TestUnknownNames:
    def test_known_and_foreign_names_pass(self) -> None:
        E.check_unknown({"VKGATE_DATABASE_URL": "x", "PATH": "/bin", "VKGATEWAY": "not ours"})

    @pytest.mark.parametrize(
        ("typo", "meant"),
        [
            ("VKGATE_DATABSE_URL", "VKGATE_DATABASE_URL"),
            ("VKGATE_LOGLEVEL", "VKGATE_LOG_LEVEL"),
            ("VKGATE_PROXY_ADR", "VKGATE_PROXY_ADDR"),
            ("VKGATE_ENCRYPTION_KEYS", "VKGATE_ENCRYPTION_KEY"),
        ],
    )
    def test_typo_is_refused_with_the_closest_name(self, typo: str, meant: str) -> None:
        with refused(f"{typo} is not a vkgate setting; did you mean {meant}?"):
            E.check_unknown({"VKGATE_HOME": "/srv", typo: "x"})

    @pytest.mark.parametrize("name", ["VKGATE_ZZZ", "VKGATE_FOO", "VKGATE_PORT"])
    def test_unrelated_unknown_name_is_refused_without_a_guess(self, name: str) -> None:
        # Every name shares the VKGATE_ prefix; that alone must not make a guess.
        with pytest.raises(E.SettingError) as caught:
            E.check_unknown({name: "1"})
        assert str(caught.value) == f"{name} is not a vkgate setting"


class TestScalars:
    def test_string_treats_empty_as_unset(self) -> None:
        assert E.string({"VKGATE_HOME": ""}, "VKGATE_HOME", "d") == "d"
        assert E.string({}, "VKGATE_HOME") is None
        assert E.string({"VKGATE_HOME": "/srv"}, "VKGATE_HOME", "d") == "/srv"

    def test_integer_default_value_and_minimum(self) -> None:
        assert E.integer({}, "VKGATE_X", 7) == 7
        assert E.integer({"VKGATE_X": ""}, "VKGATE_X", 7) == 7
        assert E.integer({"VKGATE_X": "1024"}, "VKGATE_X", 7, minimum=1024) == 1024
        with refused("VKGATE_X must be at least 1024, got 1023"):
            E.integer({"VKGATE_X": "1023"}, "VKGATE_X", 7, minimum=1024)
        with refused("VKGATE_X must be a whole number, got '1.5'"):
            E.integer({"VKGATE_X": "1.5"}, "VKGATE_X", 7)

    def test_number_default_value_and_minimum(self) -> None:
        assert E.number({}, "VKGATE_Y", 2.0) == 2.0
        assert E.number({"VKGATE_Y": "0.25"}, "VKGATE_Y", 2.0, minimum=0.05) == 0.25
        with refused("VKGATE_Y must be at least 0.05, got 0.01"):
            E.number({"VKGATE_Y": "0.01"}, "VKGATE_Y", 2.0, minimum=0.05)
        with refused("VKGATE_Y must be a number, got 'fast'"):
            E.number({"VKGATE_Y": "fast"}, "VKGATE_Y", 2.0)


class TestAddress:
    @pytest.mark.parametrize(
        ("raw", "expected"),
        [
            (None, ("127.0.0.1", 5560)),
            ("0.0.0.0:8080", ("0.0.0.0", 8080)),
            ("localhost:0", ("localhost", 0)),
            ("[::1]:5560", ("::1", 5560)),
        ],
    )
    def test_host_and_port_are_parsed(self, raw: str | None, expected: tuple[str, int]) -> None:
        env = {} if raw is None else {"VKGATE_CONTROLPLANE_ADDR": raw}
        assert E.address(env, "VKGATE_CONTROLPLANE_ADDR", "127.0.0.1:5560") == expected

    @pytest.mark.parametrize(
        ("raw", "message"),
        [
            ("localhost", "VKGATE_PROXY_ADDR must be host:port, got 'localhost'"),
            (":5563", "VKGATE_PROXY_ADDR must be host:port, got ':5563'"),
            ("localhost:http", "VKGATE_PROXY_ADDR must be host:port, got 'localhost:http'"),
            ("localhost:65536", "VKGATE_PROXY_ADDR port must be 0-65535, got 65536"),
            ("localhost:-1", "VKGATE_PROXY_ADDR port must be 0-65535, got -1"),
        ],
    )
    def test_bad_address_names_the_variable(self, raw: str, message: str) -> None:
        with refused(message):
            E.address({"VKGATE_PROXY_ADDR": raw}, "VKGATE_PROXY_ADDR", "127.0.0.1:5563")


class TestSecrets:
    def test_secret_needs_32_characters(self) -> None:
        assert E.secret({"VKGATE_JWT_SECRET": "x" * 32}, "VKGATE_JWT_SECRET") == "x" * 32
        with refused("VKGATE_JWT_SECRET must be at least 32 characters long"):
            E.secret({"VKGATE_JWT_SECRET": "x" * 31}, "VKGATE_JWT_SECRET")
        with refused("VKGATE_JWT_SECRET is required"):
            E.secret({"VKGATE_JWT_SECRET": ""}, "VKGATE_JWT_SECRET")

    def test_encryption_key_is_32_bytes_of_urlsafe_base64_padded_or_not(self) -> None:
        key = bytes(range(200, 232))
        padded = base64.urlsafe_b64encode(key).decode()
        assert "-" in padded or "_" in padded  # the URL-safe alphabet is really exercised
        for value in (padded, padded.rstrip("=")):
            assert E.encryption_key({"K": value}, "K") == key

    def test_encryption_key_of_another_length_is_refused(self) -> None:
        with refused("VKGATE_ENCRYPTION_KEY must decode to exactly 32 bytes, got 16"):
            E.encryption_key(
                {"VKGATE_ENCRYPTION_KEY": base64.urlsafe_b64encode(bytes(16)).decode()},
                "VKGATE_ENCRYPTION_KEY",
            )
        with refused("VKGATE_ENCRYPTION_KEY is required"):
            E.encryption_key({}, "VKGATE_ENCRYPTION_KEY")


class TestSecretsFile:
    def test_missing_file_has_no_values(self, tmp_path: Path) -> None:
        assert E.load_secrets_file(tmp_path / "secrets.env") == {}

    def test_comments_and_blank_lines_are_skipped(self, tmp_path: Path) -> None:
        path = tmp_path / "secrets.env"
        path.write_text("# generated\n\nVKGATE_ADMIN_TOKEN = vka-abc=def \nnot a pair\n")
        assert E.load_secrets_file(path) == {"VKGATE_ADMIN_TOKEN": "vka-abc=def"}

    def test_ensure_secrets_generates_what_is_missing_and_keeps_the_rest(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "home" / "secrets.env"
        path.parent.mkdir()
        path.write_text(f"VKGATE_KEY_PEPPER={KEY_PEPPER}\n")
        path.chmod(0o644)

        values = ensure_secrets(path)
        assert set(values) == set(GENERATED)
        assert values["VKGATE_KEY_PEPPER"] == KEY_PEPPER
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert E.load_secrets_file(path) == values
        # What it generated passes the control plane's own validation.
        settings = ControlPlaneSettings.from_env({**values, "VKGATE_HOME": str(tmp_path)})
        assert settings.admin_token == values["VKGATE_ADMIN_TOKEN"]
        assert ensure_secrets(path) == values


class TestControlPlaneSettings:
    def test_defaults(self) -> None:
        env = secrets_env("sqlite:///ignored.db")
        del env["VKGATE_DATABASE_URL"]
        settings = ControlPlaneSettings.from_env(env)
        assert (settings.host, settings.port) == ("127.0.0.1", 5560)
        assert settings.database_url == f"sqlite:///{Path('.vkgate') / 'controlplane.db'}"
        assert settings.max_body_bytes == 1024 * 1024
        assert settings.feed_poll_interval_s == 2.0
        assert settings.log_level == "INFO"
        assert settings.admin_token == ADMIN_TOKEN
        assert settings.encryption_key == base64.urlsafe_b64decode(ENCRYPTION_KEY)

    def test_database_defaults_to_sqlite_under_vkgate_home(self, tmp_path: Path) -> None:
        env = {**secrets_env("unused"), "VKGATE_HOME": str(tmp_path)}
        del env["VKGATE_DATABASE_URL"]
        assert ControlPlaneSettings.from_env(env).database_url == (
            f"sqlite:///{tmp_path / 'controlplane.db'}"
        )

    @pytest.mark.parametrize(
        "url", ["postgresql+psycopg://vkgate@db:5432/vkgate", "sqlite:////var/lib/vkgate/cp.db"]
    )
    def test_postgres_and_sqlite_urls_are_accepted(self, url: str) -> None:
        assert ControlPlaneSettings.from_env(secrets_env(url)).database_url == url

    @pytest.mark.parametrize("url", ["mysql://db/vkgate", "/var/lib/vkgate/cp.db"])
    def test_other_database_schemes_are_refused(self, url: str) -> None:
        with refused("VKGATE_DATABASE_URL must be a postgresql+psycopg:// or sqlite:/// URL"):
            ControlPlaneSettings.from_env(secrets_env(url))

    def test_every_setting_is_read(self) -> None:
        env = {
            **secrets_env("sqlite:///cp.db"),
            "VKGATE_CONTROLPLANE_ADDR": "0.0.0.0:9000",
            "VKGATE_CONTROLPLANE_MAX_BODY_BYTES": "4096",
            "VKGATE_FEED_POLL_INTERVAL_SECONDS": "0.5",
            "VKGATE_LOG_LEVEL": "debug",
        }
        settings = ControlPlaneSettings.from_env(env)
        assert (settings.host, settings.port) == ("0.0.0.0", 9000)
        assert settings.max_body_bytes == 4096
        assert settings.feed_poll_interval_s == 0.5
        assert settings.log_level == "DEBUG"

    @pytest.mark.parametrize(
        ("name", "value", "message"),
        [
            ("VKGATE_LOG_LEVEL", "verbose", "VKGATE_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR"),
            ("VKGATE_CONTROLPLANE_MAX_BODY_BYTES", "1000", "must be at least 1024, got 1000"),
            ("VKGATE_FEED_POLL_INTERVAL_SECONDS", "0", "must be at least 0.05, got 0.0"),
            ("VKGATE_CONTROLPLANE_ADDR", "127.0.0.1:99999", "port must be 0-65535, got 99999"),
            ("VKGATE_ADMIN_TOKEN", "vka-short", "VKGATE_ADMIN_TOKEN must be at least 32"),
            ("VKGATE_INTERNAL_SECRET", "", "VKGATE_INTERNAL_SECRET is required"),
            ("VKGATE_DATABSE_URL", "sqlite:///x.db", "did you mean VKGATE_DATABASE_URL?"),
        ],
    )  # fmt: skip
    def test_bad_value_names_the_variable(self, name: str, value: str, message: str) -> None:
        with pytest.raises(E.SettingError, match=re.escape(message)) as caught:
            ControlPlaneSettings.from_env({**secrets_env("sqlite:///cp.db"), name: value})
        assert name in str(caught.value)

    def test_admin_token_is_optional(self) -> None:
        env = secrets_env("sqlite:///cp.db")
        del env["VKGATE_ADMIN_TOKEN"]
        assert ControlPlaneSettings.from_env(env).admin_token is None


class TestWhereTheCliLooks:
    def test_url_prefers_the_explicit_url_without_its_trailing_slash(self) -> None:
        env = {
            "VKGATE_CONTROLPLANE_URL": "https://cp.internal:8443/",
            "VKGATE_CONTROLPLANE_ADDR": "127.0.0.1:1",
        }
        assert default_url(env) == "https://cp.internal:8443"

    @pytest.mark.parametrize(
        ("addr", "url"),
        [
            (None, "http://127.0.0.1:5560"),
            ("10.0.0.5:7000", "http://10.0.0.5:7000"),
            ("0.0.0.0:7000", "http://127.0.0.1:7000"),
            ("[::]:7000", "http://127.0.0.1:7000"),
        ],
    )
    def test_url_follows_the_listen_address(self, addr: str | None, url: str) -> None:
        env = {} if addr is None else {"VKGATE_CONTROLPLANE_ADDR": addr}
        assert default_url(env) == url

    def test_token_from_the_environment_wins_over_the_secrets_file(self, tmp_path: Path) -> None:
        (tmp_path / "secrets.env").write_text("VKGATE_ADMIN_TOKEN=vka-from-file\n")
        home = {"VKGATE_HOME": str(tmp_path)}
        assert default_token(home) == "vka-from-file"
        assert default_token({**home, "VKGATE_ADMIN_TOKEN": "vka-from-env"}) == "vka-from-env"
        assert default_token({"VKGATE_HOME": str(tmp_path / "nowhere")}) is None
