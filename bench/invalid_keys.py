"""An invalid-key flood: how fast the proxy refuses it, and how much of it reaches the control plane.

wrk (`invalid_keys.lua`, c=16) floods a proxy with keys it must refuse:

- `fixed vk-`: one well-formed but unknown `vk-` key, repeated (the negative cache answers
  after the first lookup);
- `random vk-`: a fresh random `vk-` key of the real format on every request (each misses the
  negative cache: the per-address throttle, `VKGATE_INVALID_KEYS_PER_MINUTE`, must stop them);
- `non-vk bearer`: an `sk-` token (refused by its prefix, before any lookup).

Each scenario gets a fresh proxy. Meanwhile one sequential client, from the same address, sends
requests with a valid, already cached key, and its latency is recorded; `no flood` is that
client alone. The control plane's `/metrics` (`vkgate_controlplane_resolve_key_total`,
`vkgate_controlplane_spend_records_total`) is read before and after each run: `lookups` is how
many resolve-key calls the flood caused, `ledger records` the spend records written for it
(refusals are recorded too). `added` is over the nginx upstream called directly at c=16.

    .venv/bin/python bench/invalid_keys.py                       # 5 s a flood (~45 s)
    .venv/bin/python bench/invalid_keys.py --duration 10s --scenarios random

Needs nginx and wrk (`apt-get install nginx-light wrk`).
"""

from __future__ import annotations

import argparse
import secrets
import threading
import time
from dataclasses import dataclass, field

import httpx
import stack
from stack import WrkResult, metric_delta, percentile, scrape

SCENARIOS = {
    "none": "no flood",
    "fixed": "fixed vk-",
    "random": "random vk-",
    "bearer": "non-vk bearer",
}
SETTLE_S = 2.5
"""Waited after a flood before the last scrape: the spool ships its records every second."""
BODY = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "Which river runs through Paris?"}],
    "max_tokens": 64,
}


@dataclass
class ValidClient:
    """Sequential requests with a valid key until stopped: their latencies and failures."""

    url: str
    key: str
    latencies_ms: list[float] = field(default_factory=list)
    failures: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        headers = {"Authorization": f"Bearer {self.key}"}
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set() and time.monotonic() < deadline:
                started = time.perf_counter()
                try:
                    ok = client.post(self.url, json=BODY, headers=headers).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies_ms.append((time.perf_counter() - started) * 1000)
                self.failures += not ok


@dataclass
class Run:
    scenario: str
    flood: WrkResult | None
    statuses: tuple[int, int, int, int]
    """200, 401, 429, other."""
    lookups: dict[str, float]
    """resolve-key calls by result."""
    records: float
    valid: ValidClient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", default="5s", help="wrk duration per flood (default 5s)")
    parser.add_argument("--concurrency", type=int, default=16, help="flood connections (16)")
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}"
    )
    stack.add_service_arguments(parser)
    args = parser.parse_args()
    stack.require("nginx", "wrk")
    scenarios = [s for s in args.scenarios.split(",") if s]
    if set(scenarios) - set(SCENARIOS):
        raise SystemExit(f"--scenarios takes {', '.join(SCENARIOS)}")
    extra = stack.proxy_env_args(args.proxy_env)
    seconds = float(args.duration.rstrip("s"))
    runs = []
    with stack.stack(args.log_level) as services:
        key = services.key_to(services.upstream + "/v1")
        load = {**services.env, "BENCH_KEY": ""}
        direct = f"{services.upstream}/v1/chat/completions"
        stack.wrk(direct, args.concurrency, "1s", load)  # warm-up, not recorded
        base = stack.wrk(direct, args.concurrency, args.duration, load)
        cp_metrics = f"{services.controlplane}/metrics"
        for scenario in scenarios:
            with services.proxy(extra, f"proxy-{scenario}") as proxy:
                url = f"{proxy.url}/v1/chat/completions"
                valid = ValidClient(url, key)
                valid.run(1.0)  # resolves and caches the key; not recorded
                valid = ValidClient(url, key)
                before = scrape(cp_metrics)
                client = threading.Thread(target=valid.run, args=(seconds + 5,))
                client.start()
                try:
                    if scenario == "none":
                        time.sleep(seconds)
                        flood, statuses = None, (0, 0, 0, 0)
                    else:
                        flood, statuses = flood_run(scenario, url, args, services.env)
                finally:
                    valid.stop.set()
                    client.join()
                time.sleep(SETTLE_S)
                after = scrape(cp_metrics)
                lookups = {
                    result: metric_delta(
                        before, after, "vkgate_controlplane_resolve_key_total", result=result
                    )
                    for result in ("ok", "unknown", "invalid", "error")
                }
                records = metric_delta(before, after, "vkgate_controlplane_spend_records_total")
                runs.append(Run(scenario, flood, statuses, lookups, records, valid))
    print_tables(base, runs, seconds)
    per_minute = int(
        extra.get("VKGATE_INVALID_KEYS_PER_MINUTE", stack.proxy_default("invalid_keys_per_minute"))
    )
    negative = stack.proxy_default("invalid_key_cache_s")
    print(
        f"\nProxy settings: VKGATE_INVALID_KEYS_PER_MINUTE={per_minute} (per client address), "
        f"unknown keys remembered {negative:g} s (VKGATE_INVALID_KEY_CACHE_SECONDS). The throttle "
        f"lets a burst of {per_minute} through, then one every {60 / per_minute:g} s: a "
        f"{seconds:g} s random-key flood should cause about {per_minute + seconds * per_minute / 60:.0f}"
        f" lookups. `added` is over the upstream direct at c={args.concurrency}: "
        f"p50 {base.p50_ms:.3f} ms, p99 {base.p99_ms:.3f} ms."
    )


def flood_run(
    scenario: str, url: str, args: argparse.Namespace, env: dict[str, str]
) -> tuple[WrkResult, tuple[int, int, int, int]]:
    # Made here, never printed: a well-formed key no one issued, and a foreign bearer.
    keys = {"fixed": "vk-" + secrets.token_urlsafe(32), "random": "", "bearer": "sk-bench-flood"}
    load = {
        **env,
        "BENCH_KEY_MODE": "random" if scenario == "random" else "fixed",
        "BENCH_KEY": keys[scenario],
    }
    result = stack.wrk(url, args.concurrency, args.duration, load, "invalid_keys.lua")
    line = next(x for x in result.output.splitlines() if x.startswith("STATUS "))
    s200, s401, s429, other = (int(x) for x in line.split()[1:])
    return result, (s200, s401, s429, other)


def print_tables(base: WrkResult, runs: list[Run], seconds: float) -> None:
    flood_rows = []
    for run in runs:
        flood = run.flood
        lookups = sum(run.lookups.values())
        by_result = ", ".join(f"{k} {v:.0f}" for k, v in run.lookups.items() if v)
        if flood is None:
            cells: tuple[str, ...] = ("-",) * 8
        else:
            s200, s401, s429, other = run.statuses
            span = flood.requests / flood.rps if flood.rps else seconds
            cells = (
                f"{flood.rps:,.0f}",
                f"{s401 / span:,.0f}",
                f"{s429 / span:,.0f}",
                f"{s200 + other + flood.errors}",
                f"{flood.p50_ms:.3f}",
                f"{flood.p99_ms:.3f}",
                f"{flood.p50_ms - base.p50_ms:.3f}",
                f"{flood.p99_ms - base.p99_ms:.3f}",
            )
        flood_rows.append(
            (
                SCENARIOS[run.scenario],
                *cells,
                f"{lookups:.0f}" + (f" ({by_result})" if by_result else ""),
                f"{run.records:.0f}",
            )
        )
    stack.print_table(
        (
            "flood",
            "req/s",
            "401/s",
            "429/s",
            "other",
            "p50 ms",
            "p99 ms",
            "added p50 ms",
            "added p99 ms",
            "lookups (resolve-key)",
            "ledger records",
        ),
        flood_rows,
    )
    valid_rows = []
    for run in runs:
        latencies = run.valid.latencies_ms
        valid_rows.append(
            (
                SCENARIOS[run.scenario],
                len(latencies),
                f"{percentile(latencies, 50):.3f}",
                f"{percentile(latencies, 99):.3f}",
                f"{max(latencies, default=0):.3f}",
                run.valid.failures,
            )
        )
    print("\nThe valid, cached key's sequential client, meanwhile:")
    stack.print_table(("flood", "requests", "p50 ms", "p99 ms", "max ms", "not 200"), valid_rows)


if __name__ == "__main__":
    main()
