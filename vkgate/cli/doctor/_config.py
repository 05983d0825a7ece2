"""The doctor's configuration checks: the secrets file, the settings parsed from it, metrics."""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from vkgate import env as E
from vkgate.cli._client import SECRETS_FILE, default_url
from vkgate.cli.doctor._result import Result, Status, incomplete, shown_url, skipped

if TYPE_CHECKING:
    from controlplane.settings import ControlPlaneSettings
    from proxy.settings import ProxySettings

T = TypeVar("T")


class Scope(StrEnum):
    """Which of vkgate's services this machine runs: `vkgate doctor --service`."""

    PROXY = "proxy"
    CONTROLPLANE = "controlplane"
    ALL = "all"


_NAMES = {Scope.PROXY: "proxy", Scope.CONTROLPLANE: "control plane"}


@dataclass(frozen=True, slots=True)
class Configuration:
    env: dict[str, str]
    """The environment over the secrets file, without unknown `VKGATE_*` names: those are
    reported once, and every other check still runs."""
    secrets_path: Path
    proxy: ProxySettings | None
    controlplane: ControlPlaneSettings | None


def read_configuration(
    environ: Mapping[str, str], scope: Scope = Scope.ALL
) -> tuple[Configuration, list[Result]]:
    """The settings as `vkgate up` reads them: the secrets file, overridden by the environment;
    only those of the services in `scope`."""
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
    proxy: _Parsed[ProxySettings] = _not_run(Scope.PROXY, scope)
    controlplane: _Parsed[ControlPlaneSettings] = _not_run(Scope.CONTROLPLANE, scope)
    if scope is not Scope.CONTROLPLANE:
        proxy = _parse(Scope.PROXY, ProxySettings.from_env, _describe_proxy, env, path)
    if scope is not Scope.PROXY:
        controlplane = _parse(
            Scope.CONTROLPLANE, ControlPlaneSettings.from_env, _describe_controlplane, env, path
        )
    if scope is Scope.ALL:
        proxy, controlplane = _one_service_only(proxy, controlplane, path)
    configuration = Configuration(env, path, proxy.settings, controlplane.settings)
    return configuration, [*results, proxy.result, controlplane.result]


def _unknown_message(name: str, in_file: bool) -> str:
    try:
        E.check_unknown({name: ""})
    except E.SettingError as exc:
        return f"{exc} (in the secrets file)" if in_file else str(exc)
    return f"{name} is not a vkgate setting"


_VARIABLE = re.compile(r"VKGATE_[A-Z0-9_]+")


_STAND_IN = base64.urlsafe_b64encode(bytes(32)).decode()
"""Valid as any secret and as an encryption key: put in for a missing one, to see what else the
settings would refuse."""

_SECRETS = frozenset(
    {
        "VKGATE_INTERNAL_SECRET",
        "VKGATE_JWT_SECRET",
        "VKGATE_KEY_PEPPER",
        "VKGATE_ENCRYPTION_KEY",
        "VKGATE_ADMIN_TOKEN",
        "VKGATE_METRICS_TOKEN",
        "VKGATE_TELEMETRY_KEY",
        "VKGATE_INTERNAL_SECRET_PREVIOUS",
        "VKGATE_JWT_SECRET_PREVIOUS",
        "VKGATE_KEY_PEPPERS_PREVIOUS",
        "VKGATE_ENCRYPTION_KEYS_PREVIOUS",
    }
)


@dataclass(frozen=True, slots=True)
class _Parsed(Generic[T]):
    settings: T | None
    result: Result
    missing: tuple[str, ...] = ()
    """The required secrets not set, when they are all that the settings refuse."""


def _not_run(service: Scope, scope: Scope) -> _Parsed[T]:
    return _Parsed(None, skipped(f"{_NAMES[service]} settings", f"--service {scope}"))


def _parse(
    service: Scope,
    factory: Callable[[Mapping[str, str]], T],
    describe: Callable[[T], str],
    env: Mapping[str, str],
    secrets_path: Path,
) -> _Parsed[T]:
    check = f"{_NAMES[service]} settings"
    try:
        settings = factory(env)
        return _Parsed(settings, Result(check, Status.OK, describe(settings)))
    except E.SettingError as exc:
        error = exc
    except Exception as exc:  # a settings module's bug: the other checks still run
        return _Parsed(None, incomplete(check, exc))
    try:
        missing, malformed = _diagnose(factory, env, error)
    except Exception:  # stand-ins the settings choke on: report what they said at first
        missing, malformed = [], error
    if malformed is not None:
        names = _VARIABLE.findall(str(malformed))
        name = names[0] if names else "the variable named"
        unset = f" (and {', '.join(missing)} not set)" if missing else ""
        fix = f"correct {name} as the message says"
        return _Parsed(None, Result(check, Status.FAIL, f"{malformed}{unset}", fix))
    # A machine may run only one of the services: say whose settings these are.
    fix = (
        f"set {', '.join(missing)} in the environment or in {secrets_path} if this machine runs "
        f"the {_NAMES[service]} (`vkgate up` generates every secret there)"
    )
    return _Parsed(None, Result(check, Status.FAIL, _unset(missing, error), fix), tuple(missing))


def _diagnose(
    factory: Callable[[Mapping[str, str]], object], env: Mapping[str, str], error: E.SettingError
) -> tuple[list[str], E.SettingError | None]:
    """The required secrets missing from `env`, and the first error that is not one of those:
    the settings stop at their first error, so each missing secret is stood in for in turn."""
    filled = dict(env)
    missing: list[str] = []
    while True:
        names = _VARIABLE.findall(str(error))
        if "is required" not in str(error) or not names or names[0] in missing:
            return missing, error
        missing.append(names[0])
        filled[names[0]] = _STAND_IN
        try:
            factory(filled)
        except E.SettingError as exc:
            error = exc
        else:
            return missing, None


def _unset(missing: list[str], first: E.SettingError) -> str:
    return f"{first}; also not set: {', '.join(missing[1:])}" if missing[1:] else str(first)


def _one_service_only(
    proxy: _Parsed[ProxySettings], controlplane: _Parsed[ControlPlaneSettings], secrets_path: Path
) -> tuple[_Parsed[ProxySettings], _Parsed[ControlPlaneSettings]]:
    """A warning, not a failure, for secrets missing only for the service this machine may not
    run: a proxy-only machine has no JWT secret, and needs none."""
    if proxy.missing and controlplane.settings is not None:
        return _may_not_run(proxy, Scope.PROXY, Scope.CONTROLPLANE, secrets_path), controlplane
    if controlplane.missing and proxy.settings is not None:
        return proxy, _may_not_run(controlplane, Scope.CONTROLPLANE, Scope.PROXY, secrets_path)
    return proxy, controlplane


def _may_not_run(
    parsed: _Parsed[T], service: Scope, other: Scope, secrets_path: Path
) -> _Parsed[T]:
    names = ", ".join(parsed.missing)
    fix = (
        f"if this machine runs only the {_NAMES[other]}, check it with "
        f"`vkgate doctor --service {other}`; if it runs the {_NAMES[service]}, set {names} in "
        f"the environment or in {secrets_path} (`vkgate up` generates every secret there)"
    )
    return replace(parsed, result=replace(parsed.result, status=Status.WARN, fix=fix))


def secret_values(env: Mapping[str, str]) -> set[str]:
    """The secrets in `env`: never printed by a check. (Passwords in URLs are cut out with
    the rest of the URL's user part, wherever a URL is quoted: replacing a short password
    everywhere would garble the report.)"""
    found = {value for name, value in env.items() if name in _SECRETS and len(value) >= 8}
    # The lists of previous values: each one alone is a secret too.
    return found | {
        part.strip() for value in found for part in value.split(",") if len(part.strip()) >= 8
    }


def _describe_proxy(settings: ProxySettings) -> str:
    return (
        f"valid: serves on {settings.host}:{settings.port}, control plane "
        f"{shown_url(settings.controlplane_url)}"
    )


def _describe_controlplane(settings: ControlPlaneSettings) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        backend = make_url(settings.database_url).get_backend_name()
    except (ArgumentError, ValueError):
        backend = "(URL not understood: see the database check)"
    return (
        f"valid: serves on {settings.host}:{settings.port}, database {backend}, "
        f"ledger {settings.ledger.kind}"
    )


def check_secrets_file(path: Path) -> Result:
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return skipped("secrets file", f"no {path} (`vkgate up` writes one on its first run)")
    except OSError as exc:
        return Result(
            "secrets file",
            Status.FAIL,
            f"cannot look at {path} ({exc.strerror or exc})",
            f"let this user reach {path.parent}, or run doctor as the user vkgate runs as",
        )
    if mode & 0o077:
        return Result(
            "secrets file",
            Status.WARN,
            f"{path} has mode {mode:04o}: other users can read vkgate's secrets",
            f"chmod 600 {path}",
        )
    return Result("secrets file", Status.OK, f"{path} has mode {mode:04o}")


def check_metrics_address(
    host: str, port: int | None, token: str | None, *, workers: int = 1
) -> Result:
    if port is None:
        why = (
            f"{workers} proxy workers serve no metrics"
            if workers > 1
            else "VKGATE_METRICS_ADDR=off"
        )
        return Result("metrics address", Status.OK, f"off ({why})")
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
