"""The control plane's settings, read once from the environment and validated at start-up."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vkgate import env as E

DEFAULT_ADDR = "127.0.0.1:5560"
DEFAULT_MAX_BODY_BYTES = 1024 * 1024


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
    metrics_token: str | None = None
    """When set, GET /metrics needs `Authorization: Bearer <it>`."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    feed_poll_interval_s: float = 2.0
    """How often a waiting long-poll re-reads the feed, for writes made by another replica."""
    log_level: str = "INFO"

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
            metrics_token=E.string(env, "VKGATE_METRICS_TOKEN"),
            max_body_bytes=E.integer(
                env, "VKGATE_CONTROLPLANE_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES, minimum=1024
            ),
            feed_poll_interval_s=E.number(
                env, "VKGATE_FEED_POLL_INTERVAL_SECONDS", 2.0, minimum=0.05
            ),
            log_level=E.log_level(env),
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
