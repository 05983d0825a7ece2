"""The proxy's settings, read once from the environment and validated at start-up."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from proxy.egress import Egress, egress_from_env
from proxy.spend.spool import REPLICA_ID, FullPolicy
from vkgate import env as E

DEFAULT_ADDR = "127.0.0.1:5563"
DEFAULT_METRICS_ADDR = "127.0.0.1:9464"
DEFAULT_CONTROLPLANE_URL = "http://127.0.0.1:5560"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_SPOOL_MAX_BYTES = 1024**3
MIN_SPOOL_MAX_BYTES = 1024**2
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_READ_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """What one client request may cost the server before the app sees it whole (enforced by
    the server's protocol, proxy/http1/)."""

    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    """The request line and headers together."""
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    """From a request's first byte to its last (head and body)."""


@dataclass(frozen=True, slots=True)
class ProxySettings:
    internal_secret: str
    internal_secret_previous: str | None = None
    """`VKGATE_INTERNAL_SECRET_PREVIOUS`: while the secret rolls across the replicas, signed
    calls a control plane refuses under the current secret are signed with this one."""
    host: str = "127.0.0.1"
    port: int = 5563
    controlplane_url: str = DEFAULT_CONTROLPLANE_URL
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    """A request's line and headers together; more is refused with a 431."""
    client_read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    """A request must arrive whole (head and body) within this long of its first byte, or of
    the connection; a client slower than that is cut off (after at most twice this long)."""
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
    circuit_threshold: int = 10
    circuit_window_s: float = 30.0
    circuit_cooldown_s: float = 60.0
    workers: int = 1
    log_level: str = "INFO"
    log_format: str = "json"
    log_requests: bool = True
    """Write a `request_completed` event for every request."""
    telemetry_key: bytes | None = None
    """`VKGATE_TELEMETRY_KEY`: end users appear in logs and traces as an HMAC under it, and not
    at all without it."""
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = 9464
    """None: no metrics listener (`VKGATE_METRICS_ADDR=off`)."""
    metrics_token: str | None = None
    otel_endpoint: str | None = None
    """OTLP/HTTP collector base URL; set, the proxy traces requests."""
    otel_service_name: str = "vkgate-proxy"
    otel_sample_ratio: float = 1.0
    spool_dir: Path = Path(".vkgate/spool")
    """`VKGATE_SPOOL_DIR`; by default `$VKGATE_HOME/spool`."""
    spend_flush_interval_s: float = 1.0
    spend_spool_max_bytes: int = DEFAULT_SPOOL_MAX_BYTES
    spend_spool_full_policy: FullPolicy = FullPolicy.REFUSE
    shutdown_grace_s: float = 10.0
    """How long shutdown may spend shipping the spool's last segments (after requests drain)."""
    replica_id: str | None = None
    """None: the id generated once and kept in the spool directory."""
    redis_url: str | None = None
    """Shared counters for rate limits and budget reservations; None keeps them in-process."""
    redis_timeout_s: float = 0.5
    """How long one Redis call may take before this replica falls back to its own counters."""
    redis_cluster: bool = False
    """`redis_url` names one node of a Redis Cluster; the client finds the others."""
    cache_max_bytes: int = 64 * 1024 * 1024
    """What the in-process response cache may hold (entries, keys and their overhead); unused
    when the cache is in Redis."""
    cache_max_entry_bytes: int = 1024 * 1024
    """The largest answer the response cache keeps (in either store); a larger one is served
    and not kept."""
    limits_lease_s: float = 2.0
    """How long a slice of a shared bucket is leased for before it is renewed or lapses."""
    trusted_proxy_cidrs: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    """Peers whose `X-Forwarded-For` / `X-Real-IP` name the client address."""
    invalid_key_cache_s: float = 30.0
    """How long a key the control plane did not know is refused without asking again."""
    invalid_keys_per_minute: int = 60
    """Unknown keys one client address may present per minute before it is throttled."""
    max_in_flight: int = 2048
    """Requests one proxy process serves at once; more are refused `503 gateway_busy`."""
    budget_default_output_tokens: int = 4096
    """Output a budget reserves for a request naming no `max_tokens`, when the model's own
    output cap is unknown."""
    egress: Egress = field(default_factory=Egress)
    """How provider calls (and the control plane's) leave: directly or through an HTTP proxy,
    and the CA bundle provider certificates are checked against (proxy/egress.py)."""

    @property
    def internal_secrets(self) -> tuple[str, ...]:
        """Every internal secret in force, the current one first: what a key derived from the
        internal secret must accept while it rolls."""
        previous = self.internal_secret_previous
        return (self.internal_secret,) if previous is None else (self.internal_secret, previous)

    @property
    def client_limits(self) -> ClientLimits:
        return ClientLimits(self.max_header_bytes, self.client_read_timeout_s)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ProxySettings:
        E.check_unknown(env)
        host, port = E.address(env, "VKGATE_PROXY_ADDR", DEFAULT_ADDR)
        url = (E.string(env, "VKGATE_CONTROLPLANE_URL") or DEFAULT_CONTROLPLANE_URL).rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise E.SettingError(f"VKGATE_CONTROLPLANE_URL must be an http(s) URL, got {url!r}")
        _check_server(env)
        workers = E.integer(env, "VKGATE_PROXY_WORKERS", 1, minimum=1)
        metrics_host, metrics_port = _metrics_address(env, workers)
        return cls(
            internal_secret=E.secret(env, "VKGATE_INTERNAL_SECRET"),
            internal_secret_previous=E.previous_secret(
                env, "VKGATE_INTERNAL_SECRET_PREVIOUS", "VKGATE_INTERNAL_SECRET"
            ),
            host=host,
            port=port,
            controlplane_url=url,
            max_body_bytes=E.integer(
                env, "VKGATE_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES, minimum=1024
            ),
            max_header_bytes=E.integer(
                env, "VKGATE_MAX_HEADER_BYTES", DEFAULT_MAX_HEADER_BYTES, minimum=1024
            ),
            client_read_timeout_s=_seconds(
                env, "VKGATE_CLIENT_READ_TIMEOUT_SECONDS", DEFAULT_READ_TIMEOUT_S
            ),
            connect_timeout_s=_seconds(env, "VKGATE_PROVIDER_CONNECT_TIMEOUT_SECONDS", 10.0),
            first_byte_timeout_s=_seconds(env, "VKGATE_PROVIDER_FIRST_BYTE_TIMEOUT_SECONDS", 120.0),
            total_timeout_s=_seconds(env, "VKGATE_PROVIDER_TOTAL_TIMEOUT_SECONDS", 600.0),
            auth_cache_size=E.integer(env, "VKGATE_AUTH_CACHE_MAX_ENTRIES", 10_000, minimum=1),
            auth_cache_soft_bump_s=_seconds(env, "VKGATE_AUTH_CACHE_SOFT_BUMP_SECONDS", 300.0),
            auth_cache_hard_grace_s=E.number(env, "VKGATE_AUTH_CACHE_HARD_GRACE_SECONDS", 21_600.0),
            auth_cache_config_ttl_s=_seconds(env, "VKGATE_AUTH_CACHE_CONFIG_TTL_SECONDS", 60.0),
            circuit_threshold=E.integer(env, "VKGATE_CIRCUIT_THRESHOLD", 10, minimum=1),
            circuit_window_s=_seconds(env, "VKGATE_CIRCUIT_WINDOW_S", 30.0),
            circuit_cooldown_s=_seconds(env, "VKGATE_CIRCUIT_COOLDOWN_S", 60.0),
            workers=workers,
            log_level=E.log_level(env),
            log_format=E.log_format(env),
            log_requests=E.boolean(env, "VKGATE_LOG_REQUESTS", True),
            telemetry_key=_telemetry_key(env),
            metrics_host=metrics_host,
            metrics_port=metrics_port,
            metrics_token=E.string(env, "VKGATE_METRICS_TOKEN"),
            otel_endpoint=_otel_endpoint(env),
            otel_service_name=E.string(env, "VKGATE_OTEL_SERVICE_NAME") or "vkgate-proxy",
            otel_sample_ratio=_ratio(env, "VKGATE_OTEL_SAMPLE_RATIO", 1.0),
            spool_dir=Path(E.string(env, "VKGATE_SPOOL_DIR") or E.home(env) / "spool"),
            spend_flush_interval_s=_seconds(env, "VKGATE_SPEND_FLUSH_INTERVAL_SECONDS", 1.0),
            spend_spool_max_bytes=E.integer(
                env,
                "VKGATE_SPEND_SPOOL_MAX_BYTES",
                DEFAULT_SPOOL_MAX_BYTES,
                minimum=MIN_SPOOL_MAX_BYTES,
            ),
            spend_spool_full_policy=_full_policy(env),
            shutdown_grace_s=E.number(env, "VKGATE_SHUTDOWN_GRACE_SECONDS", 10.0),
            replica_id=_replica_id(env),
            redis_url=_redis_url(env),
            redis_timeout_s=_seconds(env, "VKGATE_REDIS_TIMEOUT_SECONDS", 0.5),
            redis_cluster=E.boolean(env, "VKGATE_REDIS_CLUSTER", False),
            cache_max_bytes=E.integer(
                env, "VKGATE_CACHE_MAX_BYTES", 64 * 1024 * 1024, minimum=1024 * 1024
            ),
            cache_max_entry_bytes=E.integer(
                env, "VKGATE_CACHE_MAX_ENTRY_BYTES", 1024 * 1024, minimum=1024
            ),
            limits_lease_s=_lease_seconds(env),
            trusted_proxy_cidrs=E.networks(env, "VKGATE_TRUSTED_PROXY_CIDRS"),
            invalid_key_cache_s=_seconds(env, "VKGATE_INVALID_KEY_CACHE_SECONDS", 30.0),
            invalid_keys_per_minute=E.integer(env, "VKGATE_INVALID_KEYS_PER_MINUTE", 60, minimum=1),
            max_in_flight=E.integer(env, "VKGATE_MAX_IN_FLIGHT", 2048, minimum=1),
            budget_default_output_tokens=E.integer(
                env, "VKGATE_BUDGET_DEFAULT_OUTPUT_TOKENS", 4096, minimum=1
            ),
            egress=egress_from_env(env),
        )


def _check_server(env: Mapping[str, str]) -> None:
    """`VKGATE_PROXY_SERVER` is read only to refuse what it no longer offers: the proxy always
    runs on uvicorn, under its own HTTP/1.1 protocol (proxy/http1/)."""
    server = (E.string(env, "VKGATE_PROXY_SERVER") or "uvicorn").lower()
    if server == "granian":
        raise E.SettingError(
            "VKGATE_PROXY_SERVER=granian is no longer offered: granian cannot bound how long a "
            "request's body takes to arrive (VKGATE_CLIENT_READ_TIMEOUT_SECONDS), so a slow "
            "client could hold a request slot for good; unset VKGATE_PROXY_SERVER (the proxy "
            "runs on uvicorn; VKGATE_PROXY_WORKERS adds processes)"
        )
    if server != "uvicorn":
        raise E.SettingError(f"VKGATE_PROXY_SERVER can only be uvicorn (or unset), got {server!r}")


def _metrics_address(env: Mapping[str, str], workers: int) -> tuple[str, int | None]:
    raw = E.string(env, "VKGATE_METRICS_ADDR")
    if (raw or "").lower() == "off":
        return "127.0.0.1", None
    if workers > 1:
        # Each worker counts only its own requests, and a scrape would reach one of them at
        # random: every counter would seem to reset between scrapes. Off by default, refused
        # when asked for.
        if raw is None:
            return "127.0.0.1", None
        raise E.SettingError(
            f"VKGATE_METRICS_ADDR cannot be served by {workers} worker processes "
            "(VKGATE_PROXY_WORKERS): run one worker per replica and scale replicas, or set "
            "VKGATE_METRICS_ADDR=off"
        )
    return E.address(env, "VKGATE_METRICS_ADDR", DEFAULT_METRICS_ADDR)


def _telemetry_key(env: Mapping[str, str]) -> bytes | None:
    value = E.optional_secret(env, "VKGATE_TELEMETRY_KEY")
    return value.encode() if value is not None else None


def _otel_endpoint(env: Mapping[str, str]) -> str | None:
    url = E.string(env, "VKGATE_OTEL_ENDPOINT")
    if url is not None and not url.startswith(("http://", "https://")):
        raise E.SettingError(
            "VKGATE_OTEL_ENDPOINT must be the http(s) URL of an OTLP/HTTP collector "
            "(http://collector:4318)"
        )
    if url is None:
        return None
    # The collector's base URL; the per-signal form (…/v1/traces) is taken as well.
    return url.rstrip("/").removesuffix("/v1/traces")


def _ratio(env: Mapping[str, str], name: str, default: float) -> float:
    value = E.number(env, name, default)
    if value > 1:
        raise E.SettingError(f"{name} must be between 0 and 1, got {value}")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    value = E.number(env, name, default)
    if value <= 0:
        raise E.SettingError(f"{name} must be more than 0, got {value}")
    return value


def _lease_seconds(env: Mapping[str, str]) -> float:
    name = "VKGATE_LIMITS_LEASE_SECONDS"
    value = E.number(env, name, 2.0)
    # Below half a second renewals would cost more Redis calls than leases save; above a
    # minute a dead replica's slices would be missing for too long.
    if not 0.5 <= value <= 60:
        raise E.SettingError(f"{name} must be between 0.5 and 60, got {value}")
    return value


def _full_policy(env: Mapping[str, str]) -> FullPolicy:
    raw = (E.string(env, "VKGATE_SPEND_SPOOL_FULL_POLICY") or FullPolicy.REFUSE).lower()
    try:
        return FullPolicy(raw)
    except ValueError:
        raise E.SettingError(
            f"VKGATE_SPEND_SPOOL_FULL_POLICY must be refuse or drop_oldest, got {raw!r}"
        ) from None


def _replica_id(env: Mapping[str, str]) -> str | None:
    value = E.string(env, "VKGATE_REPLICA_ID")
    if value is not None and not REPLICA_ID.fullmatch(value):
        raise E.SettingError(
            "VKGATE_REPLICA_ID must be 1-64 characters of A-Z a-z 0-9 . _ - starting with a "
            f"letter or digit, got {value!r}"
        )
    return value


def _redis_url(env: Mapping[str, str]) -> str | None:
    url = E.string(env, "VKGATE_REDIS_URL")
    if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
        # The URL may hold a password: not repeated in the message.
        raise E.SettingError("VKGATE_REDIS_URL must be a redis://, rediss:// or unix:// URL")
    return url
