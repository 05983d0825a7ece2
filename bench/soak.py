"""A soak: mixed traffic at a fixed rate through one proxy for minutes, a table row every interval.

Starts a control plane (embedded SQLite and chDB ledger), the fake OpenAI and Anthropic
providers of `tests/support` in a process of their own (`soak_upstream.py`: real wire formats,
streams and usage, priced through `price_overrides`) and one proxy worker, seeds one
organization with five keys (three without limits; one with a requests-per-minute limit that
refuses about two thirds of its traffic with 429 once its first 30 s have emptied the bucket;
one with a total budget spent in about the first third of the run, then 402), and sends `--rate` requests a second, open loop: request n leaves
at start + n / rate however long earlier ones take (at most `--max-in-flight` at once; the
ones past that are counted as skipped, not sent). The mix:

    OpenAI chat, plain · streamed with the usage chunk asked · streamed without it · plain to
    the Anthropic provider (translated) · Anthropic /v1/messages, plain and streamed ·
    /v1/embeddings · invalid keys (a non-`vk-` bearer, a repeated unknown `vk-` key, a random
    `vk-` key each time)

Every `--interval` seconds it prints a row: requests sent, answers by status class, transport
errors, the error rate (5xx and transport errors over everything that ended), p50/p99 latency
of the interval (send to last byte), the proxy's and the control plane's RSS (VmRSS from
/proc/<pid>/status, with any child processes) and CPU share of one core, the providers' and the
load generator's own CPU share, and the most a send left after its scheduled time.

After `--minutes` it stops sending, waits for the answers still due, then for the proxy's spool
to be empty (`vkgate_spool_segments` 0 on its metrics: every record shipped and acknowledged,
so in the ledger), and checks that no spend was lost. Each request carries its own
`X-Request-ID`, which the proxy keeps as the record's request id, so the check is per request,
through the finance API (`/api/spend/ledger`, every page, and `/api/spend/report` by key):

- every request with a valid key that got an HTTP answer has exactly one ledger row, of its key,
  with its status: `confirm` for a 2xx, `fail` otherwise (`refused` for 402/429) — refusals
  are written too, since spend admission is the pipeline's outermost step; the one answer
  without a row is `503 spend_spool_full`, which is refused precisely because nothing could be
  recorded;
- where the client saw usage, the row has those input and output tokens, and every row's cost is
  its tokens at the seeded prices, to the nano-dollar;
- the report's per-key requests, refusals, failures, tokens and cost equal the sums of the rows;
- no row names a request id the generator did not send.

Requests with an invalid key are recorded too (an admit and a refused `fail`), but under no
organization (`organization_id` ''), which the finance API cannot be asked for; and admits are
not in it at all. So, once the proxy and then the control plane have stopped, `soak_ledger.py`
opens the embedded chDB ledger in a process of its own and the soak checks that every answered
request has exactly one admit record and every invalid-key request exactly one key-less refused
`fail` row with its status (`--no-raw-check` skips this). A request that ended in a transport
error may or may not have a row (the proxy records 499 when it saw the client leave): listed
apart.

Last, RSS growth after warm-up (the last row against the first row at or after `--warmup`
seconds) is set against the 10 % goal. The exit status is 1 when spend was lost or mismatched,
the spool did not empty or reported dropped, refused, rejected or corrupt records, the proxy's
RSS grew by `--max-growth` or more, or the error rate passed `--max-error-rate`. The control
plane's growth is shown beside it, not gated: its embedded chDB ledger holds more data as the
run goes on.

This module starts and stops the services and judges the run; `soak_traffic.py` holds the mix
and the generator, `soak_table.py` the rows, `soak_seed.py` the organization and its keys,
`soak_check.py` the spend check.

    .venv/bin/python bench/soak.py                                   # 10 min at 80 requests/s
    .venv/bin/python bench/soak.py --minutes 2 --interval 20 --rate 50

Everything listens on and talks to 127.0.0.1 only; every process started is stopped by its PID
however the run ends (Ctrl-C and SIGTERM included). Needs no nginx and no wrk.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import stack
from soak_check import (
    SHOWN,
    Raw,
    check,
    check_raw,
    ledger_rows,
    print_check,
    raw_ledger,
    spend_report,
    wait_for_spool,
)
from soak_seed import Seeded, seed
from soak_table import MIB, Row, run_load
from soak_traffic import Generator

HERE = Path(__file__).resolve().parent


# -- main --------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="load duration (10)")
    parser.add_argument("--rate", type=float, default=80.0, help="requests a second (80)")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds a row (30)")
    parser.add_argument(
        "--warmup", type=float, default=60.0, help="RSS growth counts from here, seconds (60)"
    )
    parser.add_argument("--max-growth", type=float, default=0.10, help="RSS growth goal (0.10)")
    parser.add_argument(
        "--max-error-rate", type=float, default=0.001, help="5xx + transport errors (0.001)"
    )
    parser.add_argument("--max-in-flight", type=int, default=512, help="requests at once (512)")
    parser.add_argument("--request-timeout", type=float, default=30.0, help="per request, s (30)")
    parser.add_argument("--drain-timeout", type=float, default=60.0, help="spool wait, s (60)")
    parser.add_argument("--seed", type=int, default=1, help="the mix's random seed (1)")
    parser.add_argument(
        "--no-raw-check",
        dest="raw_check",
        action="store_false",
        help="skip reading admits and key-less rows from the embedded ledger at the end",
    )
    stack.add_service_arguments(parser)
    args = parser.parse_args()
    if args.rate <= 0 or args.minutes <= 0 or args.interval <= 0:
        raise SystemExit("--rate, --minutes and --interval must be positive")
    extra = stack.proxy_env_args(args.proxy_env)
    # SIGTERM unwinds like Ctrl-C: every process started is stopped by its PID on the way out.
    signal.signal(signal.SIGTERM, _terminate)
    with stack.stack(args.log_level, upstream=False) as services:
        openai_port, anthropic_port = stack.free_port(), stack.free_port()
        upstream_args = [
            sys.executable,
            str(HERE / "soak_upstream.py"),
            str(openai_port),
            str(anthropic_port),
        ]
        with stack.started(upstream_args, services.env, services.work / "upstream.log") as fakes:
            stack.wait_ok(f"http://127.0.0.1:{openai_port}/healthz", fakes)
            stack.wait_ok(f"http://127.0.0.1:{anthropic_port}/healthz", fakes)
            with services.admin() as admin:
                seeded = seed(
                    admin,
                    f"http://127.0.0.1:{openai_port}/v1",
                    f"http://127.0.0.1:{anthropic_port}",
                    args,
                )
            with services.proxy(extra, "soak-proxy") as proxy:
                pids = {
                    "proxy": proxy.pid,
                    "controlplane": services.controlplane_pid,
                    "upstream": fakes.pid,
                }
                generator = Generator(proxy.url, seeded.keys, args, args.seed)
                print(
                    f"soak: {args.rate:g} requests/s for {args.minutes:g} min, a row every "
                    f"{args.interval:g} s; proxy {proxy.url} (pid {proxy.pid}), control plane "
                    f"pid {services.controlplane_pid}, providers pid {fakes.pid}\n",
                    flush=True,
                )
                rows = run_load(generator, pids, args)
                emptied, waited, samples = wait_for_spool(proxy.metrics, args.drain_timeout)
                with services.admin() as admin:
                    ledger = ledger_rows(admin, seeded.organization)
                    report = spend_report(admin, seeded.organization)
            # The proxy has stopped; with the control plane stopped too, its chDB ledger can be
            # opened from another process.
            raw = raw_ledger(services, f"soak-{generator.run_id}-") if args.raw_check else None
        status = conclude(
            args, generator, seeded, rows, emptied, waited, samples, ledger, report, raw
        )
        if status:
            keep_logs(services.work)
    return status


def keep_logs(work: Path) -> None:
    """The services' logs of a failed run, copied out of the working directory the stack
    removes (the ledger and the spool stay behind: they are large)."""
    kept = Path(tempfile.mkdtemp(prefix="vkgate-soak-logs-"))
    for log in work.glob("*.log"):
        shutil.copy2(log, kept / log.name)
    print(f"services' logs kept in {kept}")


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def conclude(
    args: argparse.Namespace,
    generator: Generator,
    seeded: Seeded,
    rows: list[Row],
    emptied: bool,
    waited: float,
    samples: dict[str, float],
    ledger: list[dict[str, Any]],
    report: dict[str, dict[str, Any]],
    raw: Raw | None,
) -> int:
    failures = []
    ended = sum(r.ended for r in rows)
    errors = sum(r.errors for r in rows)
    error_rate = errors / ended if ended else 0.0
    sent = len(generator.sent)
    seconds = args.minutes * 60
    print(
        f"\n{sent:,} requests sent in {seconds:g} s ({sent / seconds:,.1f}/s), "
        f"{generator.skipped:,} skipped at --max-in-flight; error rate {error_rate:.3%} "
        f"({errors:,} 5xx or transport errors), goal at most {args.max_error_rate:.3%}."
    )
    latencies = [x for r in rows for x in r.window.latencies]
    print(
        f"Latency over the whole run (send to last byte, every answer): p50 "
        f"{stack.percentile(latencies, 50) * 1000:.1f} ms, p99 "
        f"{stack.percentile(latencies, 99) * 1000:.1f} ms, p99.9 "
        f"{stack.percentile(latencies, 99.9) * 1000:.1f} ms, max "
        f"{max(latencies, default=0) * 1000:.1f} ms."
    )
    if error_rate > args.max_error_rate:
        failures.append(f"error rate {error_rate:.3%}")
    spool = {
        name: stack.metric_sum(samples, name)
        for name in (
            "vkgate_spool_shipped_records_total",
            "vkgate_spool_dropped_records_total",
            "vkgate_spool_refused_requests_total",
            "vkgate_spool_rejected_segments_total",
            "vkgate_spool_corrupt_records_total",
        )
    }
    print(
        f"Spool {'empty' if emptied else 'NOT empty'} {waited:.1f} s after the load: "
        + ", ".join(
            f"{k.removeprefix('vkgate_spool_').removesuffix('_total')} {v:,.0f}"
            for k, v in spool.items()
        )
    )
    if not emptied:
        failures.append(f"the spool did not empty in {args.drain_timeout:g} s")
    for name in list(spool)[1:]:
        if spool[name]:
            failures.append(f"{name} {spool[name]:,.0f}")
    result = check(generator, seeded, ledger, report)
    print_check(result, seeded)
    if result.problems:
        print("\nLOST OR MISMATCHED SPEND:")
        for line in result.problems:
            print(f"  {line}")
        if result.problem_count > len(result.problems):
            print(f"  … and {result.problem_count - len(result.problems):,} more")
        failures.append(f"{result.problem_count:,} spend problem(s)")
    else:
        print(
            f"\nZero lost spend: each of the {sum(t.answered for t in result.tallies.values()):,} "
            "answered valid-key requests has exactly one ledger row with its status and, where "
            "the client saw usage, its tokens; costs match the seeded prices; the report matches "
            f"the rows ({len(ledger):,} rows)."
        )
    if raw is not None:
        raw_problems, summary = check_raw(generator, raw)
        if raw_problems:
            print("\nADMITS OR KEY-LESS ROWS WRONG (embedded ledger, read directly):")
            for line in raw_problems[:SHOWN]:
                print(f"  {line}")
            if len(raw_problems) > SHOWN:
                print(f"  … and {len(raw_problems) - SHOWN:,} more")
            failures.append(f"{len(raw_problems):,} admit/key-less problem(s)")
        else:
            print(
                f"Embedded ledger, read directly after the control plane stopped: every answered "
                f"request has exactly one admit record, and every invalid-key request one "
                f"refused `fail` row under no organization with its status ({summary})."
            )
    growth_lines = _growth(rows, args.warmup)
    for name, (base, last, growth, at) in growth_lines.items():
        verdict = "within" if growth < args.max_growth else "OVER"
        print(
            f"{name} RSS after warm-up ({at:.0f} s) {base / MIB:.1f} MiB -> end {last / MIB:.1f} "
            f"MiB: {growth:+.1%}, {verdict} the {args.max_growth:.0%} goal"
            + ("" if name == "proxy" else " (reported, not gated)")
        )
        if name == "proxy" and growth >= args.max_growth:
            failures.append(f"proxy RSS grew {growth:+.1%}")
    cpu = [r.cpu["generator"] for r in rows]
    if cpu:
        print(
            f"Load generator CPU: {sum(cpu) / len(cpu):.0f} % of one core on average "
            f"(max {max(cpu):.0f} %), {_generator_per_request(rows):.0f} µs per request."
        )
    if failures:
        print("\nFAILED: " + "; ".join(failures))
        return 1
    print("\nPASSED")
    return 0


def _growth(rows: list[Row], warmup: float) -> dict[str, tuple[int, int, float, float]]:
    during = [r for r in rows if r.window.sent]
    if len(during) < 2:
        return {}
    base = next((r for r in during if r.elapsed >= warmup - 1e-6), during[0])
    if base is during[-1]:
        base = during[0]
    last = during[-1]
    out = {}
    for name, a, b in (
        ("proxy", base.proxy_rss, last.proxy_rss),
        ("control plane", base.controlplane_rss, last.controlplane_rss),
    ):
        out[name] = (a, b, (b - a) / a if a else 0.0, base.elapsed)
    return out


def _generator_per_request(rows: list[Row]) -> float:
    """The generator's CPU µs per request sent, over the rows of the load."""
    total = sent = 0.0
    previous = 0.0
    for r in rows:
        total += r.cpu["generator"] / 100 * (r.elapsed - previous)
        sent += r.window.sent
        previous = r.elapsed
    return total / sent * 1e6 if sent else 0.0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        # The stack's context managers have stopped every process by then.
        print("\nsoak: interrupted; the processes it started are stopped", file=sys.stderr)
        sys.exit(130)
