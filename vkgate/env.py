"""Reading `VKGATE_*` settings: the registry of known names and typed, validated parsers.

Settings are read once at start-up by each service's own settings object; every parser raises
`SettingError` naming the variable, so a bad deployment fails before it serves anything.
"""

from __future__ import annotations

import base64
import difflib
import ipaddress
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

# Every setting either service or the CLI understands. An unknown `VKGATE_*` name is refused at
# start-up: a typo in a deployment (VKGATE_DATABSE_URL) must not silently fall back to defaults.
KNOWN: frozenset[str] = frozenset(
    {
        "VKGATE_HOME",
        "VKGATE_LOG_LEVEL",
        "VKGATE_LOG_FORMAT",
        "VKGATE_TELEMETRY_KEY",
        "VKGATE_SHUTDOWN_GRACE_SECONDS",
        # control plane
        "VKGATE_CONTROLPLANE_ADDR",
        "VKGATE_CONTROLPLANE_URL",
        "VKGATE_CONTROLPLANE_MAX_BODY_BYTES",
        "VKGATE_DATABASE_URL",
        "VKGATE_LEDGER_URL",
        "VKGATE_ADMIN_TOKEN",
        "VKGATE_ADMIN_AUTH_FAILURES_PER_MINUTE",
        "VKGATE_CONSOLE_SESSION_IDLE_MINUTES",
        "VKGATE_INTERNAL_SECRET",
        "VKGATE_JWT_SECRET",
        "VKGATE_KEY_PEPPER",
        "VKGATE_ENCRYPTION_KEY",
        # rotation: the values being rotated out, still accepted (README "Rotating secrets")
        "VKGATE_INTERNAL_SECRET_PREVIOUS",
        "VKGATE_JWT_SECRET_PREVIOUS",
        "VKGATE_KEY_PEPPERS_PREVIOUS",
        "VKGATE_ENCRYPTION_KEYS_PREVIOUS",
        "VKGATE_FEED_POLL_INTERVAL_SECONDS",
        # proxy
        "VKGATE_PROXY_ADDR",
        "VKGATE_METRICS_ADDR",
        "VKGATE_METRICS_TOKEN",
        "VKGATE_MAX_BODY_BYTES",
        "VKGATE_MAX_HEADER_BYTES",
        "VKGATE_CLIENT_READ_TIMEOUT_SECONDS",
        "VKGATE_REDIS_URL",
        "VKGATE_SPOOL_DIR",
        "VKGATE_SPEND_FLUSH_INTERVAL_SECONDS",
        "VKGATE_SPEND_SPOOL_MAX_BYTES",
        "VKGATE_AUTH_CACHE_SOFT_BUMP_SECONDS",
        "VKGATE_AUTH_CACHE_HARD_GRACE_SECONDS",
        "VKGATE_AUTH_CACHE_CONFIG_TTL_SECONDS",
        "VKGATE_AUTH_CACHE_MAX_ENTRIES",
        "VKGATE_PROVIDER_CONNECT_TIMEOUT_SECONDS",
        "VKGATE_PROVIDER_FIRST_BYTE_TIMEOUT_SECONDS",
        "VKGATE_PROVIDER_TOTAL_TIMEOUT_SECONDS",
        "VKGATE_PROVIDER_CA_BUNDLE",
        "VKGATE_PROXY_SERVER",
        "VKGATE_PROXY_WORKERS",
        "VKGATE_SPEND_SPOOL_FULL_POLICY",
        "VKGATE_REPLICA_ID",
        "VKGATE_CIRCUIT_THRESHOLD",
        "VKGATE_CIRCUIT_WINDOW_S",
        "VKGATE_CIRCUIT_COOLDOWN_S",
        "VKGATE_REDIS_TIMEOUT_SECONDS",
        "VKGATE_REDIS_CLUSTER",
        "VKGATE_CACHE_MAX_BYTES",
        "VKGATE_CACHE_MAX_ENTRY_BYTES",
        "VKGATE_LIMITS_LEASE_SECONDS",
        "VKGATE_TRUSTED_PROXY_CIDRS",
        "VKGATE_INVALID_KEY_CACHE_SECONDS",
        "VKGATE_INVALID_KEYS_PER_MINUTE",
        "VKGATE_BUDGET_DEFAULT_OUTPUT_TOKENS",
        "VKGATE_MAX_IN_FLIGHT",
        "VKGATE_LOG_REQUESTS",
        "VKGATE_OTEL_ENDPOINT",
        "VKGATE_OTEL_SERVICE_NAME",
        "VKGATE_OTEL_SAMPLE_RATIO",
    }
)

SECRET_MIN_LENGTH = 32
V = TypeVar("V")


class SettingError(ValueError):
    """A setting is missing, unknown or malformed; the message names the variable."""


def check_unknown(env: Mapping[str, str]) -> None:
    """Refuse `VKGATE_*` variables that no part of vkgate reads."""
    # Compared without the shared prefix: with it, any name looks close to some setting.
    known = {name.removeprefix("VKGATE_"): name for name in KNOWN}
    for name in sorted(env):
        if name.startswith("VKGATE_") and name not in KNOWN:
            close = difflib.get_close_matches(name.removeprefix("VKGATE_"), list(known), n=1)
            hint = f"; did you mean {known[close[0]]}?" if close else ""
            raise SettingError(f"{name} is not a vkgate setting{hint}")


def string(env: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    value = env.get(name)
    if value is None or value == "":
        return default
    return value


def integer(env: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingError(f"{name} must be a whole number, got {raw!r}") from None
    if value < minimum:
        raise SettingError(f"{name} must be at least {minimum}, got {value}")
    return value


def number(env: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(f"{name} must be a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise SettingError(f"{name} must be a finite number, got {raw!r}")
    if value < minimum:
        raise SettingError(f"{name} must be at least {minimum}, got {value}")
    return value


def address(env: Mapping[str, str], name: str, default: str) -> tuple[str, int]:
    """Parse `host:port` (IPv6 hosts in brackets)."""
    raw = env.get(name) or default
    host, sep, port = raw.rpartition(":")
    if not sep or not host:
        raise SettingError(f"{name} must be host:port, got {raw!r}")
    try:
        port_number = int(port)
    except ValueError:
        raise SettingError(f"{name} must be host:port, got {raw!r}") from None
    if not 0 <= port_number <= 65535:
        raise SettingError(f"{name} port must be 0-65535, got {port_number}")
    return host.strip("[]"), port_number


def networks(
    env: Mapping[str, str], name: str
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """A comma-separated list of CIDRs (`10.0.0.0/8, ::1/128`); empty when unset."""
    found = []
    for part in (p.strip() for p in (string(env, name) or "").split(",")):
        if not part:
            continue
        try:
            found.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise SettingError(
                f"{name} must be a comma-separated list of CIDRs (10.0.0.0/8, ::1/128), "
                f"got {part!r}"
            ) from None
    return tuple(found)


def secret(env: Mapping[str, str], name: str) -> str:
    """A shared secret of at least 32 characters; required."""
    value = env.get(name)
    if not value:
        raise SettingError(f"{name} is required (any string of {SECRET_MIN_LENGTH}+ characters)")
    if len(value) < SECRET_MIN_LENGTH:
        raise SettingError(f"{name} must be at least {SECRET_MIN_LENGTH} characters long")
    return value


def encryption_key(env: Mapping[str, str], name: str) -> bytes:
    """32 random bytes, URL-safe base64."""
    value = env.get(name)
    if not value:
        raise SettingError(f"{name} is required (32 random bytes, URL-safe base64)")
    return _key_bytes(value, name)


def _key_bytes(value: str, name: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (ValueError, TypeError):
        raise SettingError(f"{name} must be URL-safe base64") from None
    if len(raw) != 32:
        raise SettingError(f"{name} must decode to exactly 32 bytes, got {len(raw)}")
    return raw


def previous_secret(env: Mapping[str, str], name: str, current: str) -> str | None:
    """`<current>_PREVIOUS`: the secret being rotated out, accepted beside the current one."""
    value = optional_secret(env, name)
    if value is not None and value == env.get(current):
        raise SettingError(
            f"{name} repeats {current}: set {current} to the new secret and {name} to the old one"
        )
    return value


def previous_secrets(env: Mapping[str, str], name: str, current: str) -> tuple[str, ...]:
    """A comma-separated list of secrets being rotated out (each 32+ characters), newest first."""
    values = _listed(env, name)
    for position, value in enumerate(values, 1):
        if len(value) < SECRET_MIN_LENGTH:
            raise SettingError(
                f"{name}: value {position} of {len(values)} is shorter than {SECRET_MIN_LENGTH} "
                "characters (the list is comma-separated)"
            )
    return _distinct(values, name, env.get(current), current)


def previous_encryption_keys(env: Mapping[str, str], name: str, current: str) -> tuple[bytes, ...]:
    """A comma-separated list of encryption keys being rotated out, each like the current one."""
    values = _listed(env, name)
    keys = tuple(
        _key_bytes(value, f"{name} (key {position} of {len(values)})")
        for position, value in enumerate(values, 1)
    )
    current_value = env.get(current)
    return _distinct(
        keys, name, _key_bytes(current_value, current) if current_value else None, current
    )


def _listed(env: Mapping[str, str], name: str) -> list[str]:
    return [part.strip() for part in (string(env, name) or "").split(",") if part.strip()]


def _distinct(
    values: Sequence[V], name: str, current_value: V | None, current: str
) -> tuple[V, ...]:
    if current_value is not None and current_value in values:
        raise SettingError(
            f"{name} lists {current} itself: set {current} to the new value and keep only the "
            f"old ones in {name}"
        )
    if len(set(values)) != len(values):
        raise SettingError(f"{name} lists the same value twice")
    return tuple(values)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def log_level(env: Mapping[str, str]) -> str:
    value = (string(env, "VKGATE_LOG_LEVEL", "INFO") or "INFO").upper()
    if value not in LOG_LEVELS:
        raise SettingError(f"VKGATE_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR, got {value!r}")
    return value


LOG_FORMATS = ("json", "text")


def log_format(env: Mapping[str, str]) -> str:
    value = (string(env, "VKGATE_LOG_FORMAT", "json") or "json").lower()
    if value not in LOG_FORMATS:
        raise SettingError(f"VKGATE_LOG_FORMAT must be json or text, got {value!r}")
    return value


def boolean(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = string(env, name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingError(f"{name} must be true or false, got {raw!r}")


def optional_secret(env: Mapping[str, str], name: str) -> str | None:
    """A secret of at least 32 characters, or None when unset."""
    value = env.get(name)
    if not value:
        return None
    if len(value) < SECRET_MIN_LENGTH:
        raise SettingError(f"{name} must be at least {SECRET_MIN_LENGTH} characters long")
    return value


def home(env: Mapping[str, str]) -> Path:
    return Path(env.get("VKGATE_HOME") or ".vkgate")


def load_secrets_file(path: Path) -> dict[str, str]:
    """Read the `NAME=value` file `vkgate up` writes; missing file means no values."""
    values: dict[str, str] = {}
    if not path.exists():
        return values
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        values[name.strip()] = value.strip()
    return values


def environment() -> dict[str, str]:
    """The process environment: the one place vkgate reads `os.environ`."""
    return dict(os.environ)
