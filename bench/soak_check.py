"""The soak's spend check: every request the generator sent against the ledger it left.

Waits for the proxy's spool to empty, reads every ledger row of the organization and the
per-key report through the finance API and checks them request by request (`check`, printed
by `print_check`); then reads the admits and key-less rows from the embedded ledger once the
control plane has stopped (`raw_ledger`, through `soak_ledger.py`) and checks those
(`check_raw`).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import stack
from soak_seed import Seeded
from soak_traffic import KEY_SHARES, NANO, NANO_PER_TOKEN, Generator, cost, none

HERE = Path(__file__).resolve().parent
SHOWN = 40
"""Problems listed at most, of each check."""


# -- waiting for the spool, reading the ledger -------------------------------------------------


def wait_for_spool(metrics_url: str, timeout: float) -> tuple[bool, float, dict[str, float]]:
    """Wait until the proxy's spool holds nothing unshipped; (emptied, seconds, last scrape)."""
    started = time.monotonic()
    samples: dict[str, float] = {}
    while time.monotonic() - started < timeout:
        samples = stack.scrape(metrics_url)
        if stack.metric_sum(samples, "vkgate_spool_segments") == 0:
            return True, time.monotonic() - started, samples
        time.sleep(0.25)
    return False, time.monotonic() - started, samples


def ledger_rows(admin: stack.Admin, organization: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor: str | None = None
    with httpx.Client(base_url=admin.url, headers=admin.headers, timeout=120) as api:
        for _ in range(100_000):  # bounded: a page is 1,000 rows
            params = {"organization_id": organization, "limit": "1000"}
            if cursor:
                params["cursor"] = cursor
            response = api.get("/api/spend/ledger", params=params)
            response.raise_for_status()
            page = response.json()
            rows.extend(page["data"])
            cursor = page["next_cursor"]
            if not cursor:
                break
    return rows


def spend_report(admin: stack.Admin, organization: str) -> dict[str, dict[str, Any]]:
    response = httpx.get(
        f"{admin.url}/api/spend/report",
        params={"organization_id": organization, "group_by": "virtual_key"},
        headers=admin.headers,
        timeout=120,
    )
    response.raise_for_status()
    return {str(r["virtual_key_id"]): r for r in response.json()["rows"]}


def nanos(usd: str) -> int:
    return int(Decimal(usd) * NANO)


# -- the check -------------------------------------------------------------------------------


@dataclass
class KeyTally:
    sent: int = 0
    answered: int = 0
    served: int = 0
    refused: int = 0
    """402 and 429."""
    other: int = 0
    """Any other non-2xx answer."""
    transport: int = 0
    usage_seen: int = 0
    client_in: int = 0
    client_out: int = 0
    rows: int = 0
    confirms: int = 0
    fails: int = 0
    ledger_in: int = 0
    ledger_out: int = 0
    ledger_nano: int = 0
    expected_nano: int = 0
    missing: int = 0


@dataclass
class Check:
    tallies: dict[str, KeyTally]
    problems: list[str]
    """The first `SHOWN` problems found."""
    problem_count: int
    transport_with_row: int
    transport_without_row: int
    invalid_sent: int
    invalid_statuses: Counter[int]
    statuses: dict[str, Counter[int]]


def check(
    generator: Generator,
    seeded: Seeded,
    rows: list[dict[str, Any]],
    report: dict[str, dict[str, Any]],
) -> Check:
    """Every request against the ledger's rows, and the rows against the report."""
    problems: list[str] = []
    count = 0
    names = {v: k for k, v in seeded.key_ids.items()}
    by_request: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_request[str(row["request_id"])].append(row)
    tallies = {name: KeyTally() for name in KEY_SHARES}
    statuses: dict[str, Counter[int]] = {name: Counter() for name in KEY_SHARES}
    invalid_statuses: Counter[int] = Counter()
    invalid_sent = transport_with_row = transport_without_row = 0

    def problem(text: str) -> None:
        nonlocal count
        count += 1
        if count <= SHOWN:
            problems.append(text)

    for request_id, sent in generator.sent.items():
        found = by_request.pop(request_id, [])
        if not sent.key:
            invalid_sent += 1
            invalid_statuses[sent.status] += 1
            if found:
                problem(f"{request_id}: invalid-key request has a row in the organization")
            continue
        tally = tallies[sent.key]
        tally.sent += 1
        statuses[sent.key][sent.status] += 1
        if sent.status == 0:
            tally.transport += 1
            if found:
                transport_with_row += 1
            else:
                transport_without_row += 1
            _count_rows(tally, found)
            continue
        tally.answered += 1
        if 200 <= sent.status < 300:
            tally.served += 1
        elif sent.status in (402, 429):
            tally.refused += 1
        else:
            tally.other += 1
        if not found:
            if sent.code == "spend_spool_full":
                continue  # refused because nothing could be recorded: no row by design
            tally.missing += 1
            problem(f"{request_id} ({sent.kind.name}, {sent.key}, {sent.status}): no ledger row")
            continue
        if len(found) > 1:
            problem(f"{request_id}: {len(found)} ledger rows")
        row = found[0]
        if row.get("virtual_key_id") != seeded.key_ids[sent.key]:
            problem(f"{request_id}: row names key {row.get('virtual_key_id')}, sent as {sent.key}")
        if int(row["status"]) != sent.status:
            problem(f"{request_id}: row status {row['status']}, answer {sent.status}")
        served = 200 <= sent.status < 300
        if row["kind"] != ("confirm" if served else "fail"):
            problem(f"{request_id}: a {row['kind']} row for a {sent.status} answer")
        if sent.status in (402, 429) and not row.get("refused"):
            problem(f"{request_id}: {sent.status} answer not recorded as refused")
        if sent.usage is not None and sent.kind.name == "chat stream":
            problem(f"{request_id}: a stream that did not ask for usage was sent the usage chunk")
        if sent.usage is not None:
            tally.usage_seen += 1
            tally.client_in += sent.usage[0]
            tally.client_out += sent.usage[1]
            seen = (int(row["input_tokens"]), int(row["output_tokens"]))
            if seen != sent.usage:
                problem(
                    f"{request_id} ({sent.kind.name}): row tokens {seen}, client saw {sent.usage}"
                )
        elif served and sent.kind.usage is not none and sent.kind.name != "chat stream":
            problem(f"{request_id} ({sent.kind.name}): a 2xx answer showed the client no usage")
        _count_rows(tally, found)
    for request_id, extra in by_request.items():
        problem(f"{request_id}: {len(extra)} ledger row(s) for a request not sent")
    for name, tally in tallies.items():
        if tally.ledger_nano != tally.expected_nano:
            problem(
                f"{name}: ledger cost {tally.ledger_nano} nano-USD, its tokens at the seeded "
                f"prices {tally.expected_nano}"
            )
        line = report.get(seeded.key_ids[name])
        if line is None:
            if tally.rows:
                problem(f"{name}: no line in /api/spend/report")
            continue
        reported = (
            int(line["requests"]),
            int(line["refused"]) + int(line["failed"]),
            int(line["input_tokens"]),
            int(line["output_tokens"]),
            nanos(str(line["cost_usd"])),
        )
        summed = (tally.confirms, tally.fails, tally.ledger_in, tally.ledger_out, tally.ledger_nano)
        if reported != summed:
            problem(f"{name}: report {reported} != ledger rows {summed}")
    extra_keys = set(report) - set(names)
    if extra_keys:
        problem(f"report lines for keys not seeded: {sorted(extra_keys)}")
    return Check(
        tallies,
        problems,
        count,
        transport_with_row,
        transport_without_row,
        invalid_sent,
        invalid_statuses,
        statuses,
    )


def _count_rows(tally: KeyTally, found: list[dict[str, Any]]) -> None:
    for row in found:
        tally.rows += 1
        if row["kind"] == "confirm":
            tally.confirms += 1
        else:
            tally.fails += 1
        tokens_in, tokens_out = int(row["input_tokens"]), int(row["output_tokens"])
        tally.ledger_in += tokens_in
        tally.ledger_out += tokens_out
        tally.ledger_nano += nanos(str(row["cost_usd"]))
        model = row.get("upstream_model")
        if row["kind"] == "confirm" and model in NANO_PER_TOKEN:
            tally.expected_nano += cost(model, tokens_in, tokens_out)


def print_check(result: Check, seeded: Seeded) -> None:
    print("\nSpend per key: what the generator saw against the ledger (finance API)")
    table = []
    for name, t in result.tallies.items():
        table.append(
            (
                name,
                f"{t.sent:,}",
                f"{t.answered:,}",
                f"{t.served:,} / {t.refused:,} / {t.other:,}",
                f"{t.transport:,}",
                f"{t.confirms:,} / {t.fails:,}",
                f"{t.missing:,}",
                f"{t.usage_seen:,}",
                f"{t.client_in:,} / {t.client_out:,}",
                f"{t.ledger_in:,} / {t.ledger_out:,}",
                f"{Decimal(t.ledger_nano) / NANO}",
            )
        )
    stack.print_table(
        (
            "key",
            "sent",
            "answered",
            "2xx / 402+429 / other",
            "transport err",
            "ledger confirm / fail",
            "missing rows",
            "usage seen",
            "client tokens in / out",
            "ledger tokens in / out (all rows)",
            "ledger cost USD",
        ),
        table,
    )
    for name, counts in result.statuses.items():
        shown = ", ".join(f"{s or 'err'}: {n:,}" for s, n in sorted(counts.items()))
        print(f"  {name}: {shown}")
    invalid = ", ".join(f"{s or 'err'}: {n:,}" for s, n in sorted(result.invalid_statuses.items()))
    print(
        f"  invalid keys: {result.invalid_sent:,} sent ({invalid}); recorded under no "
        "organization, which the finance API does not serve (checked below in the embedded "
        "ledger unless --no-raw-check)"
    )
    print(
        f"Limits: `limited` {seeded.rpm} requests a minute; `budgeted` a total budget of "
        f"${seeded.budget_usd}."
    )
    if result.transport_with_row or result.transport_without_row:
        print(
            f"Transport errors on valid keys: {result.transport_with_row} with a ledger row, "
            f"{result.transport_without_row} without (either may be right)."
        )


# -- admits and key-less rows, in the embedded ledger ----------------------------------------


@dataclass(frozen=True)
class Raw:
    admits: dict[str, int]
    """Request id -> admit records."""
    keyless: dict[str, list[list[Any]]]
    """Request id -> its rows under no organization, `[kind, status, refused]` each."""


def raw_ledger(services: stack.Stack, prefix: str) -> Raw | None:
    """Admits and key-less rows, read from the embedded ledger after the control plane stops."""
    ledger_dir = Path(services.env["VKGATE_HOME"]) / "ledger"
    process = services.controlplane_process
    if process is None or not ledger_dir.is_dir():
        print("\n(no embedded ledger to open: admits and key-less rows not checked)")
        return None
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    found = subprocess.run(
        [sys.executable, str(HERE / "soak_ledger.py"), str(ledger_dir), prefix],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=services.env,
    )
    if found.returncode != 0:
        print(f"\n(reading the embedded ledger failed: {found.stderr.strip()[-500:]})")
        return None
    data = json.loads(found.stdout)
    return Raw(data["admits"], data["keyless"])


def check_raw(generator: Generator, raw: Raw) -> tuple[list[str], str]:
    """Every request has one admit; every invalid-key request one key-less row with its status."""
    problems: list[str] = []
    admits, keyless = dict(raw.admits), dict(raw.keyless)
    invalid_rows = 0
    for request_id, sent in generator.sent.items():
        n = admits.pop(request_id, 0)
        rows = keyless.pop(request_id, [])
        unrecorded = sent.code == "spend_spool_full"
        if sent.status and not unrecorded and n != 1:
            problems.append(f"{request_id} ({sent.kind.name}, {sent.status}): {n} admit records")
        elif n > 1:
            problems.append(f"{request_id} ({sent.kind.name}): {n} admit records")
        if sent.key:
            if rows:
                problems.append(
                    f"{request_id}: a valid-key request has a row under no organization"
                )
            continue
        if not sent.status:
            continue
        invalid_rows += len(rows)
        if len(rows) != 1:
            problems.append(f"{request_id} ({sent.kind.name}): {len(rows)} key-less rows")
        elif rows[0][0] != "fail" or rows[0][1] != sent.status or not rows[0][2]:
            problems.append(
                f"{request_id} ({sent.kind.name}): key-less row {rows[0]}, answer {sent.status}"
            )
    for request_id in admits:
        problems.append(f"{request_id}: an admit record for a request not sent")
    for request_id in keyless:
        problems.append(f"{request_id}: a key-less row for a request not sent")
    summary = (
        f"{len(raw.admits):,} request ids with admit records; {invalid_rows:,} key-less refusal "
        "rows for the invalid-key requests"
    )
    return problems, summary
