"""`vkgate doctor`: check this machine's vkgate configuration and what it can reach."""

from __future__ import annotations

import json
from collections.abc import Mapping

import click
import httpx

from vkgate import env as E
from vkgate.cli.doctor._config import (
    Configuration,
    Scope,
    check_metrics_address,
    check_secrets_file,
    read_configuration,
    secret_values,
)
from vkgate.cli.doctor._controlplane import check_controlplane, check_internal_api
from vkgate.cli.doctor._result import Result, Status, guarded, incomplete, redacted, skipped
from vkgate.cli.doctor._spool import (
    Backlog,
    check_spool_backlog,
    check_spool_directory,
    check_spool_space,
    survey_spool,
)
from vkgate.cli.doctor._stores import check_database, check_ledger, check_redis
from vkgate.clock import Clock, SystemClock

HTTP_TIMEOUT_S = 3.0
LABELS = {Status.OK: "ok", Status.WARN: "warn", Status.FAIL: "FAIL", Status.SKIP: "skip"}


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as a JSON list.")
@click.option(
    "--service",
    type=click.Choice([scope.value for scope in Scope]),
    default=Scope.ALL.value,
    show_default=True,
    help="The services this machine runs: the other's own checks are skipped.",
)
@click.pass_context
def doctor(ctx: click.Context, as_json: bool, service: str) -> None:
    """Check this machine's vkgate settings and what it can reach; exit 1 on any failure."""
    # `vkgate --url URL doctor` probes that control plane, as the admin commands would.
    url = ctx.parent.params.get("url") if ctx.parent is not None else None
    results = run_checks(E.environment(), scope=Scope(service), url=url)
    if as_json:
        click.echo(json.dumps([result.as_json() for result in results], indent=2))
    else:
        click.echo(render(results))
    if any(result.status is Status.FAIL for result in results):
        ctx.exit(1)


def run_checks(
    environ: Mapping[str, str],
    *,
    scope: Scope = Scope.ALL,
    url: str | None = None,
    clock: Clock | None = None,
    timeout_s: float = HTTP_TIMEOUT_S,
) -> list[Result]:
    """Every check, in the order printed; one that needs what an earlier one refused is skipped,
    and one that raises is a FAIL of its own."""
    config, results = read_configuration(environ, scope)
    results.append(guarded("secrets file", lambda: check_secrets_file(config.secrets_path)))
    clock = clock or SystemClock()
    live, reached = _controlplane_checks(config, scope, url, clock, timeout_s)
    results += reached
    results += _store_checks(config, scope, controlplane_up=live)
    results += _proxy_side(config, scope, clock)
    # Whatever a check quoted (an exception's message above all), no secret is printed.
    hidden = secret_values(config.env)
    return [redacted(result, hidden) for result in results]


def _controlplane_checks(
    config: Configuration, scope: Scope, url: str | None, clock: Clock, timeout_s: float
) -> tuple[bool, list[Result]]:
    """Whether the control plane answered /healthz, and the results of asking it."""
    target = url or config.env.get("VKGATE_CONTROLPLANE_URL")
    if not target:
        why = "no control plane URL (VKGATE_CONTROLPLANE_ADDR is not valid, see above)"
        return False, [skipped("control plane", why), skipped("internal API", why)]
    # Both services hold the same internal secret; only those in `scope` were read, so with
    # --service controlplane this is the control plane's.
    settings = config.proxy or config.controlplane
    # The way the proxy goes there: through the egress proxy its settings name, or directly
    # (never by httpx's own reading of the proxy variables).
    proxy = config.proxy.egress.httpx_proxy(target) if config.proxy is not None else None
    try:
        with httpx.Client(
            base_url=target,
            timeout=timeout_s,
            headers={"User-Agent": "vkgate-doctor"},
            transport=httpx.HTTPTransport(proxy=proxy),
        ) as http:
            reached, live = check_controlplane(http)
            if not live:
                signed = skipped("internal API", "the control plane did not answer (see above)")
            elif settings is None:
                signed = skipped(
                    "internal API", "no valid VKGATE_INTERNAL_SECRET (see the settings above)"
                )
            else:
                secret, previous = settings.internal_secret, settings.internal_secret_previous
                signed = guarded(
                    "internal API",
                    lambda: check_internal_api(http, secret, clock, previous=previous),
                )
    except Exception as exc:  # one broken check must not cost the report the others
        why = "the control plane check did not complete (see above)"
        return False, [incomplete("control plane", exc), skipped("internal API", why)]
    return live, [reached, signed]


def _store_checks(config: Configuration, scope: Scope, *, controlplane_up: bool) -> list[Result]:
    if scope is Scope.PROXY:
        why = "--service proxy"
        database, ledger = skipped("database", why), skipped("ledger", why)
    elif config.controlplane is None:
        why = "no usable control plane settings (see above)"
        database, ledger = skipped("database", why), skipped("ledger", why)
    else:
        settings = config.controlplane
        database = guarded("database", lambda: check_database(settings.database_url))
        ledger = guarded(
            "ledger", lambda: check_ledger(settings.ledger, controlplane_up=controlplane_up)
        )
    if scope is Scope.CONTROLPLANE:
        # Only the proxy keeps counters in Redis: the control plane never connects to it.
        why = "--service controlplane (only the proxy uses Redis)"
        return [database, ledger, skipped("redis", why)]
    if config.proxy is None:
        return [database, ledger, skipped("redis", "no usable proxy settings (see above)")]
    redis_url = config.proxy.redis_url
    return [database, ledger, guarded("redis", lambda: check_redis(redis_url))]


def _proxy_side(config: Configuration, scope: Scope, clock: Clock) -> list[Result]:
    proxy = config.proxy
    if proxy is None:
        why = (
            "--service controlplane"
            if scope is Scope.CONTROLPLANE
            else "no usable proxy settings (see above)"
        )
        return [
            skipped("spool directory", why),
            skipped("spool disk space", why),
            skipped("spool backlog", why),
            skipped("metrics address", why),
        ]
    try:
        backlog = survey_spool(proxy.spool_dir, clock.time())
        waiting = check_spool_backlog(backlog)
    except Exception as exc:  # one broken check must not cost the report the others
        backlog, waiting = Backlog(), incomplete("spool backlog", exc)
    return [
        guarded("spool directory", lambda: check_spool_directory(proxy.spool_dir)),
        guarded(
            "spool disk space",
            lambda: check_spool_space(proxy.spool_dir, proxy.spend_spool_max_bytes, backlog),
        ),
        waiting,
        guarded(
            "metrics address",
            lambda: check_metrics_address(
                proxy.metrics_host, proxy.metrics_port, proxy.metrics_token, workers=proxy.workers
            ),
        ),
    ]


def render(results: list[Result]) -> str:
    """One line per check (status, name, what was found), and a `fix:` line under a problem."""
    width = max(len(result.check) for result in results)
    lines = []
    for result in results:
        lines.append(f"{LABELS[result.status]:<4}  {result.check:<{width}}  {result.detail}")
        if result.fix and result.status in (Status.FAIL, Status.WARN):
            lines.append(f"{'':<4}  {'':<{width}}  fix: {result.fix}")
    counts = {status: sum(r.status is status for r in results) for status in Status}
    lines.append(
        f"\n{counts[Status.OK]} ok, {counts[Status.WARN]} warn, {counts[Status.FAIL]} FAIL, "
        f"{counts[Status.SKIP]} skipped"
    )
    return "\n".join(lines)
