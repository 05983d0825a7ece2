"""`vkgate doctor`: check this machine's vkgate configuration and what it can reach."""

from __future__ import annotations

import json
from collections.abc import Mapping

import click
import httpx

from vkgate import env as E
from vkgate.cli.doctor._config import (
    Configuration,
    check_metrics_address,
    check_secrets_file,
    read_configuration,
)
from vkgate.cli.doctor._controlplane import check_controlplane, check_internal_api
from vkgate.cli.doctor._result import Result, Status, skipped
from vkgate.cli.doctor._spool import (
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
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Check this machine's vkgate settings and what it can reach; exit 1 on any failure."""
    # `vkgate --url URL doctor` probes that control plane, as the admin commands would.
    url = ctx.parent.params.get("url") if ctx.parent is not None else None
    results = run_checks(E.environment(), url=url)
    if as_json:
        click.echo(json.dumps([result.as_json() for result in results], indent=2))
    else:
        click.echo(render(results))
    if any(result.status is Status.FAIL for result in results):
        ctx.exit(1)


def run_checks(
    environ: Mapping[str, str],
    *,
    url: str | None = None,
    clock: Clock | None = None,
    timeout_s: float = HTTP_TIMEOUT_S,
) -> list[Result]:
    """Every check, in the order printed; one that needs what an earlier one refused is skipped."""
    config, results = read_configuration(environ)
    results.append(check_secrets_file(config.secrets_path))
    clock = clock or SystemClock()
    live, reached = _controlplane_checks(config, url, clock, timeout_s)
    results += reached
    results += _store_checks(config, controlplane_up=live)
    results += _proxy_side(config, clock)
    return results


def _controlplane_checks(
    config: Configuration, url: str | None, clock: Clock, timeout_s: float
) -> tuple[bool, list[Result]]:
    """Whether the control plane answered /healthz, and the results of asking it."""
    target = url or config.env.get("VKGATE_CONTROLPLANE_URL")
    if not target:
        why = "no control plane URL (VKGATE_CONTROLPLANE_ADDR is not valid, see above)"
        return False, [skipped("control plane", why), skipped("internal API", why)]
    settings = config.proxy or config.controlplane
    with httpx.Client(
        base_url=target, timeout=timeout_s, headers={"User-Agent": "vkgate-doctor"}
    ) as http:
        reached, live = check_controlplane(http)
        if not live:
            signed = skipped("internal API", "the control plane did not answer (see above)")
        elif settings is None:
            signed = skipped(
                "internal API", "no valid VKGATE_INTERNAL_SECRET (see the settings above)"
            )
        else:
            signed = check_internal_api(http, settings.internal_secret, clock)
    return live, [reached, signed]


def _store_checks(config: Configuration, *, controlplane_up: bool) -> list[Result]:
    if config.controlplane is None:
        why = "the control plane settings are not valid (see above)"
        database, ledger = skipped("database", why), skipped("ledger", why)
    else:
        database = check_database(config.controlplane.database_url)
        ledger = check_ledger(config.controlplane.ledger, controlplane_up=controlplane_up)
    if config.proxy is None:
        return [database, ledger, skipped("redis", "the proxy settings are not valid (see above)")]
    return [database, ledger, check_redis(config.proxy.redis_url)]


def _proxy_side(config: Configuration, clock: Clock) -> list[Result]:
    proxy = config.proxy
    if proxy is None:
        why = "the proxy settings are not valid (see above)"
        return [skipped("spool", why), skipped("metrics address", why)]
    backlog = survey_spool(proxy.spool_dir, clock.now().timestamp())
    return [
        check_spool_directory(proxy.spool_dir),
        check_spool_space(proxy.spool_dir, proxy.spend_spool_max_bytes, backlog),
        check_spool_backlog(backlog),
        check_metrics_address(proxy.metrics_host, proxy.metrics_port, proxy.metrics_token),
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
