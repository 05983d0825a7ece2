"""The control plane's settings, read once from the environment and validated at start-up."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from vkgate import env as E

DEFAULT_ADDR = "127.0.0.1:5560"
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_LEDGER_DATABASE = "vkgate"
DEFAULT_ADMIN_AUTH_FAILURES_PER_MINUTE = 30
DEFAULT_CONSOLE_SESSION_IDLE_MINUTES = 30
_DATABASE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True, slots=True)
class LedgerLocation:
    """Where the spend ledger lives: a ClickHouse server over HTTP(S), or embedded chDB."""

    kind: Literal["chdb", "http"]
    database: str = DEFAULT_LEDGER_DATABASE
    path: Path | None = None
    """chDB's data directory (one per process: chDB is an embedded engine)."""
    host: str | None = None
    port: int | None = None
    secure: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def display(self) -> str:
        """The URL without its password, for messages and logs."""
        if self.kind == "chdb":
            return f"chdb://{self.path}"
        user = f"{self.username}@" if self.username else ""
        scheme = "https" if self.secure else "http"
        return f"{scheme}://{user}{self.host}:{self.port}/{self.database}"


@dataclass(frozen=True, slots=True)
class ControlPlaneSettings:
    database_url: str
    host: str
    port: int
    internal_secret: str
    jwt_secret: str
    key_pepper: str
    encryption_key: bytes
    admin_token: str | None
    internal_secret_previous: str | None = None
    """Also accepted on signed internal calls while the secret rolls across the replicas."""
    jwt_secret_previous: str | None = None
    """Also accepted when a resolution's JWT is verified; new JWTs are signed with the current."""
    key_peppers_previous: tuple[str, ...] = ()
    """Key and token hashes made under these are still found, and re-hashed under the current
    pepper when presented."""
    encryption_keys_previous: tuple[bytes, ...] = ()
    """Credentials encrypted under these still decrypt; `vkgate secrets reencrypt` moves them to
    the current key."""
    metrics_token: str | None = None
    """When set, GET /metrics needs `Authorization: Bearer <it>`."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    admin_auth_failures_per_minute: int = DEFAULT_ADMIN_AUTH_FAILURES_PER_MINUTE
    """Failed admin authentications one client address may make in a minute before the rest
    of that minute is answered 429 (controlplane/throttle.py)."""
    console_session_idle_minutes: int = DEFAULT_CONSOLE_SESSION_IDLE_MINUTES
    """A web console session unused this long is over: its next request signs in again."""
    trusted_proxy_cidrs: tuple[str, ...] = ()
    """Networks (`10.0.0.0/8`) of peers whose `X-Forwarded-For` / `X-Real-IP` name the client address (an ingress in
    front of the admin API): the throttle then counts each client, not the ingress."""
    feed_poll_interval_s: float = 2.0
    """How often a waiting long-poll re-reads the feed, for writes made by another replica."""
    log_level: str = "INFO"
    log_format: str = "json"
    shutdown_grace_s: float = 10.0
    """How long a stopping control plane waits for requests in progress (long-polls are
    answered at once)."""
    ledger: LedgerLocation = LedgerLocation(kind="chdb", path=Path(".vkgate") / "ledger")

    @property
    def internal_secrets(self) -> tuple[str, ...]:
        """The internal API's secrets a signature may be made with: the current one first."""
        previous = self.internal_secret_previous
        return (self.internal_secret,) if previous is None else (self.internal_secret, previous)

    @property
    def jwt_secrets(self) -> tuple[str, ...]:
        previous = self.jwt_secret_previous
        return (self.jwt_secret,) if previous is None else (self.jwt_secret, previous)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ControlPlaneSettings:
        E.check_unknown(env)
        home = E.home(env)
        host, port = E.address(env, "VKGATE_CONTROLPLANE_ADDR", DEFAULT_ADDR)
        admin_token = E.string(env, "VKGATE_ADMIN_TOKEN")
        if admin_token is not None and len(admin_token) < E.SECRET_MIN_LENGTH:
            raise E.SettingError(
                f"VKGATE_ADMIN_TOKEN must be at least {E.SECRET_MIN_LENGTH} characters long"
            )
        return cls(
            database_url=database_url(env, home),
            host=host,
            port=port,
            internal_secret=E.secret(env, "VKGATE_INTERNAL_SECRET"),
            jwt_secret=E.secret(env, "VKGATE_JWT_SECRET"),
            key_pepper=E.secret(env, "VKGATE_KEY_PEPPER"),
            encryption_key=E.encryption_key(env, "VKGATE_ENCRYPTION_KEY"),
            admin_token=admin_token,
            internal_secret_previous=E.previous_secret(
                env, "VKGATE_INTERNAL_SECRET_PREVIOUS", "VKGATE_INTERNAL_SECRET"
            ),
            jwt_secret_previous=E.previous_secret(
                env, "VKGATE_JWT_SECRET_PREVIOUS", "VKGATE_JWT_SECRET"
            ),
            key_peppers_previous=E.previous_secrets(
                env, "VKGATE_KEY_PEPPERS_PREVIOUS", "VKGATE_KEY_PEPPER"
            ),
            encryption_keys_previous=E.previous_encryption_keys(
                env, "VKGATE_ENCRYPTION_KEYS_PREVIOUS", "VKGATE_ENCRYPTION_KEY"
            ),
            metrics_token=E.string(env, "VKGATE_METRICS_TOKEN"),
            max_body_bytes=E.integer(
                env, "VKGATE_CONTROLPLANE_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES, minimum=1024
            ),
            admin_auth_failures_per_minute=E.integer(
                env,
                "VKGATE_ADMIN_AUTH_FAILURES_PER_MINUTE",
                DEFAULT_ADMIN_AUTH_FAILURES_PER_MINUTE,
                minimum=1,
            ),
            console_session_idle_minutes=E.integer(
                env,
                "VKGATE_CONSOLE_SESSION_IDLE_MINUTES",
                DEFAULT_CONSOLE_SESSION_IDLE_MINUTES,
                minimum=1,
            ),
            trusted_proxy_cidrs=tuple(
                str(n) for n in E.networks(env, "VKGATE_TRUSTED_PROXY_CIDRS")
            ),
            feed_poll_interval_s=E.number(
                env, "VKGATE_FEED_POLL_INTERVAL_SECONDS", 2.0, minimum=0.05
            ),
            log_level=E.log_level(env),
            log_format=E.log_format(env),
            shutdown_grace_s=E.number(env, "VKGATE_SHUTDOWN_GRACE_SECONDS", 10.0),
            ledger=ledger_location(env, home),
        )


def database_url(env: Mapping[str, str], home: Path) -> str:
    url = E.string(env, "VKGATE_DATABASE_URL")
    if url is None:
        return f"sqlite:///{home / 'controlplane.db'}"
    if not url.startswith(("sqlite:", "postgresql")):
        raise E.SettingError(
            "VKGATE_DATABASE_URL must be a postgresql+psycopg:// or sqlite:/// URL"
        )
    return url


LEDGER_URL_FORMS = "http(s)://[user[:password]@]host[:port]/database or chdb:///path/to/directory"


def ledger_location(env: Mapping[str, str], home: Path) -> LedgerLocation:
    """VKGATE_LEDGER_URL, by default embedded chDB in VKGATE_HOME/ledger."""
    url = E.string(env, "VKGATE_LEDGER_URL")
    if url is None:
        return LedgerLocation(kind="chdb", path=home / "ledger")
    if url.startswith("chdb://"):
        # Like a path: chdb:///var/lib/vkgate/ledger is absolute, chdb://ledger is relative.
        path = url.removeprefix("chdb://")
        if not path or path.startswith(":memory:") or "?" in path:
            raise E.SettingError(
                f"VKGATE_LEDGER_URL: chdb:// needs the ledger's directory, as in {LEDGER_URL_FORMS}"
            )
        return LedgerLocation(kind="chdb", path=Path(path))
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise E.SettingError(
            f"VKGATE_LEDGER_URL is malformed ({exc}); use {LEDGER_URL_FORMS}"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise E.SettingError(f"VKGATE_LEDGER_URL must be {LEDGER_URL_FORMS}")
    if parts.query or parts.fragment:
        raise E.SettingError("VKGATE_LEDGER_URL takes no query string or fragment")
    database = parts.path.strip("/") or DEFAULT_LEDGER_DATABASE
    if not _DATABASE_NAME.match(database):
        raise E.SettingError(
            f"VKGATE_LEDGER_URL: the database name must be letters, digits and _, got {database!r}"
        )
    secure = parts.scheme == "https"
    return LedgerLocation(
        kind="http",
        database=database,
        host=parts.hostname,
        port=port or (8443 if secure else 8123),
        secure=secure,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )
