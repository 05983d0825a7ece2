"""The proxy's settings, read once from the environment and validated at start-up."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vkgate import env as E

DEFAULT_ADDR = "127.0.0.1:5563"
DEFAULT_CONTROLPLANE_URL = "http://127.0.0.1:5560"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
SERVERS = ("uvicorn", "granian")


@dataclass(frozen=True, slots=True)
class ProxySettings:
    internal_secret: str
    host: str = "127.0.0.1"
    port: int = 5563
    controlplane_url: str = DEFAULT_CONTROLPLANE_URL
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    connect_timeout_s: float = 10.0
    first_byte_timeout_s: float = 120.0
    """Also bounds any silence between two chunks of a stream."""
    total_timeout_s: float = 600.0
    auth_cache_size: int = 10_000
    auth_cache_soft_bump_s: float = 300.0
    auth_cache_hard_grace_s: float = 21_600.0
    auth_cache_config_ttl_s: float = 60.0
    controlplane_timeout_s: float = 5.0
    changes_timeout_s: float = 20.0
    """How long one change-feed long-poll waits (the control plane caps it at 25 s)."""
    server: str = "uvicorn"
    workers: int = 1
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ProxySettings:
        E.check_unknown(env)
        host, port = E.address(env, "VKGATE_PROXY_ADDR", DEFAULT_ADDR)
        url = (E.string(env, "VKGATE_CONTROLPLANE_URL") or DEFAULT_CONTROLPLANE_URL).rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise E.SettingError(f"VKGATE_CONTROLPLANE_URL must be an http(s) URL, got {url!r}")
        server = (E.string(env, "VKGATE_PROXY_SERVER") or "uvicorn").lower()
        if server not in SERVERS:
            raise E.SettingError(f"VKGATE_PROXY_SERVER must be uvicorn or granian, got {server!r}")
        return cls(
            internal_secret=E.secret(env, "VKGATE_INTERNAL_SECRET"),
            host=host,
            port=port,
            controlplane_url=url,
            max_body_bytes=E.integer(
                env, "VKGATE_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES, minimum=1024
            ),
            connect_timeout_s=_seconds(env, "VKGATE_PROVIDER_CONNECT_TIMEOUT_SECONDS", 10.0),
            first_byte_timeout_s=_seconds(env, "VKGATE_PROVIDER_FIRST_BYTE_TIMEOUT_SECONDS", 120.0),
            total_timeout_s=_seconds(env, "VKGATE_PROVIDER_TOTAL_TIMEOUT_SECONDS", 600.0),
            auth_cache_size=E.integer(env, "VKGATE_AUTH_CACHE_MAX_ENTRIES", 10_000, minimum=1),
            auth_cache_soft_bump_s=_seconds(env, "VKGATE_AUTH_CACHE_SOFT_BUMP_SECONDS", 300.0),
            auth_cache_hard_grace_s=E.number(env, "VKGATE_AUTH_CACHE_HARD_GRACE_SECONDS", 21_600.0),
            auth_cache_config_ttl_s=_seconds(env, "VKGATE_AUTH_CACHE_CONFIG_TTL_SECONDS", 60.0),
            server=server,
            workers=E.integer(env, "VKGATE_PROXY_WORKERS", 1, minimum=1),
            log_level=E.log_level(env),
        )


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    value = E.number(env, name, default)
    if value <= 0:
        raise E.SettingError(f"{name} must be more than 0, got {value}")
    return value
