"""The doctor's configuration checks: the secrets file, the settings parsed from it, metrics."""

from __future__ import annotations

import contextlib
import ipaddress
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from vkgate import env as E
from vkgate.cli._client import SECRETS_FILE, default_url
from vkgate.cli.doctor._result import Result, Status, shown_url, skipped

if TYPE_CHECKING:
    from controlplane.settings import ControlPlaneSettings
    from proxy.settings import ProxySettings

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Configuration:
    env: dict[str, str]
    """The environment over the secrets file, without unknown `VKGATE_*` names: those are
    reported once, and every other check still runs."""
    secrets_path: Path
    proxy: ProxySettings | None
    controlplane: ControlPlaneSettings | None


def read_configuration(environ: Mapping[str, str]) -> tuple[Configuration, list[Result]]:
    """The settings as `vkgate up` reads them: the secrets file, overridden by the environment."""
    from controlplane.settings import ControlPlaneSettings
    from proxy.settings import ProxySettings

    path = E.home(environ) / SECRETS_FILE
    results = []
    try:
        stored = E.load_secrets_file(path)
    except (OSError, UnicodeDecodeError) as exc:
        stored = {}
        fix = f"make {path} readable by this user, or remove it"
        results.append(Result("configuration", Status.FAIL, f"cannot read {path} ({exc})", fix))
    merged = {**stored, **environ}
    unknown = sorted(n for n in merged if n.startswith("VKGATE_") and n not in E.KNOWN)
    env = {name: value for name, value in merged.items() if name not in unknown}
    count = sum(1 for name in env if name.startswith("VKGATE_"))
    with contextlib.suppress(E.SettingError):  # reported by the control plane settings
        # As `vkgate up` and the admin commands do: the control plane of VKGATE_CONTROLPLANE_ADDR.
        env.setdefault("VKGATE_CONTROLPLANE_URL", default_url(env))
    if unknown:
        detail = "; ".join(
            _unknown_message(name, name in stored and name not in environ) for name in unknown
        )
        fix = (
            f"rename or remove {', '.join(unknown)}: vkgate's services refuse to start with a "
            "VKGATE_* variable they do not know"
        )
        results.append(Result("configuration", Status.FAIL, detail, fix))
    elif not results:
        source = f"{len(stored)} from {path}" if path.exists() else f"no {path}"
        results.append(Result("configuration", Status.OK, f"{count} VKGATE_* settings ({source})"))
    proxy = _parse("proxy", ProxySettings.from_env, _describe_proxy, env, path)
    controlplane = _parse(
        "control plane", ControlPlaneSettings.from_env, _describe_controlplane, env, path
    )
    configuration = Configuration(env, path, proxy.settings, controlplane.settings)
    return configuration, [*results, proxy.result, controlplane.result]


def _unknown_message(name: str, in_file: bool) -> str:
    try:
        E.check_unknown({name: ""})
    except E.SettingError as exc:
        return f"{exc} (in the secrets file)" if in_file else str(exc)
    return f"{name} is not a vkgate setting"


_VARIABLE = re.compile(r"VKGATE_[A-Z0-9_]+")


@dataclass(frozen=True, slots=True)
class _Parsed(Generic[T]):
    settings: T | None
    result: Result


def _parse(
    service: str,
    factory: Callable[[Mapping[str, str]], T],
    describe: Callable[[T], str],
    env: Mapping[str, str],
    secrets_path: Path,
) -> _Parsed[T]:
    check = f"{service} settings"
    try:
        settings = factory(env)
    except E.SettingError as exc:
        message = str(exc)
        names = _VARIABLE.findall(message)
        name = names[0] if names else "the variable named"
        if "is required" in message:
            # A machine may run only one of the services: say whose setting this is.
            fix = (
                f"set {name} in the environment or in {secrets_path} if this machine runs the "
                f"{service} (`vkgate up` generates every secret there)"
            )
        else:
            fix = f"correct {name} as the message says"
        return _Parsed(None, Result(check, Status.FAIL, message, fix))
    return _Parsed(settings, Result(check, Status.OK, describe(settings)))


def _describe_proxy(settings: ProxySettings) -> str:
    return (
        f"valid: serves on {settings.host}:{settings.port}, control plane "
        f"{shown_url(settings.controlplane_url)}"
    )


def _describe_controlplane(settings: ControlPlaneSettings) -> str:
    from sqlalchemy.engine import make_url

    backend = make_url(settings.database_url).get_backend_name()
    return (
        f"valid: serves on {settings.host}:{settings.port}, database {backend}, "
        f"ledger {settings.ledger.kind}"
    )


def check_secrets_file(path: Path) -> Result:
    if not path.exists():
        return skipped("secrets file", f"no {path} (`vkgate up` writes one on its first run)")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return Result(
            "secrets file",
            Status.WARN,
            f"{path} has mode {mode:04o}: other users can read vkgate's secrets",
            f"chmod 600 {path}",
        )
    return Result("secrets file", Status.OK, f"{path} has mode {mode:04o}")


def check_metrics_address(host: str, port: int | None, token: str | None) -> Result:
    if port is None:
        return Result("metrics address", Status.OK, "off (VKGATE_METRICS_ADDR=off)")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if loopback:
        return Result("metrics address", Status.OK, f"{shown} (this machine only)")
    if token:
        return Result("metrics address", Status.OK, f"{shown}, VKGATE_METRICS_TOKEN required")
    return Result(
        "metrics address",
        Status.WARN,
        f"{shown} is open to other machines and VKGATE_METRICS_TOKEN is not set",
        "set VKGATE_METRICS_TOKEN (scrapers send it as a bearer token), or bind "
        "VKGATE_METRICS_ADDR to 127.0.0.1",
    )
