"""What reading a budget's spend costs as an organization's month fills up, on embedded chDB.

Fills a fresh ledger with one organization's month (50 keys, 200 end users, spread evenly over
December) in blocks of 2,400 rows, as full segments arrive, and after each `--rows` step times
the control plane's read of two budgets (the organization's month, one key's month) from the
daily sums, against the same sums over every ledger row with FINAL (how budgets were read
before the daily sums). Both must agree.

With `--first-day`, the ledger is a new install's on its first day instead: the daily sums
begin (`since`) a minute after the migrations ran, as they do, so the read also looks at the
ledger's own rows ingested before then (a first minute of 2,400 rows), and every other row is
ingested after `since`, timed within the hour after it. The read is then also timed without
the ledger's skip indexes (`use_skip_indexes = 0`), as it ran before the index on `ingested_at`
(migrations/clickhouse/0003_ingested_at_index.sql).

    .venv/bin/python bench/budget_spend_read.py [--rows 100000,1000000,3000000] [--reads 5]
        [--first-day]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from controlplane.ledger import queries
from controlplane.ledger.client import connect
from controlplane.ledger.migrate import upgrade
from controlplane.settings import LedgerLocation
from vkgate.windows import window_bounds

MONTH = datetime(2026, 12, 1, tzinfo=UTC)
MONTH_SECONDS = 31 * 86_400
BLOCK = 2_400
"""Outcome rows of a full 2 MiB segment: the view sums each inserted block on its own."""
TIME = "DateTime64(6, 'UTC')"
FINAL_READ = (
    f"SELECT sumIf(cost_nano_usd, at >= {{s:{TIME}}} AND at < {{e:{TIME}}}), "
    f"sumIf(cost_nano_usd, at >= {{s:{TIME}}} AND at < {{e:{TIME}}} AND virtual_key_id = {{v:String}}) "
    f"FROM ledger_rows FINAL WHERE organization_id = {{org:String}} AND at >= {{s:{TIME}}}"
)


def fill(client: Any, first: int, count: int) -> None:
    """`count` more ledger rows (numbered from `first`), spread evenly over the month."""
    at = (
        "toDateTime64('2026-12-01 00:00:00', 6, 'UTC') + "
        f"toIntervalSecond(intDiv(number * {MONTH_SECONDS}, {count}))"
    )
    insert(client, first, count, at, "now64(6)")


def fill_first_day(client: Any, first: int, count: int, total: int) -> None:
    """`count` more rows of a first day (numbered from `first` of `total`): ingested after
    `since` and timed within the hour after it, in the order they arrive."""
    at = (
        f"{queries.SINCE} + toIntervalMicrosecond(intDiv(({first} + number) * 3600000000, {total}))"
    )
    insert(client, first, count, at, f"{at} + toIntervalSecond(1)")


def insert(client: Any, first: int, count: int, at: str, ingested_at: str) -> None:
    client.command(
        "INSERT INTO ledger_rows (id, kind, replica_id, seq, segment_id, request_id, at, route, "
        "organization_id, virtual_key_id, end_user, status, usage_source, latency_ms, "
        "cost_nano_usd, price_source, price_version, ingested_at) "
        f"SELECT toString(generateUUIDv4()), 'confirm', 'bench', {first} + number, 'seg', "
        f"toString(number), {at}, '/v1/chat/completions', "
        "'org_bench', concat('vk_', toString(number % 50)), concat('u', toString(number % 200)), "
        f"200, 'provider', 1.0, 1000, 'bench', 'v1', {ingested_at} "
        f"FROM numbers({count}) SETTINGS max_insert_block_size={BLOCK}, "
        f"min_insert_block_size_rows={BLOCK}, min_insert_block_size_bytes=0"
    )


def timed(client: Any, sql: str, parameters: dict[str, Any], reads: int) -> tuple[float, tuple]:
    times, answer = [], ()
    for _ in range(reads):
        began = time.perf_counter()
        answer = tuple(client.query(sql, parameters=parameters).result_rows[0])
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000, answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="100000,1000000,3000000", help="comma list, rising")
    parser.add_argument("--reads", type=int, default=5, help="reads timed per step (median)")
    parser.add_argument("--first-day", action="store_true", help="a new install's first day")
    args = parser.parse_args()
    steps = [int(n) for n in args.rows.split(",")]
    with tempfile.TemporaryDirectory() as directory:
        location = LedgerLocation(kind="chdb", path=Path(directory) / "ledger")
        upgrade(location)
        client = connect(location)
        try:
            if args.first_day:
                # The first minute's rows, ingested before `since`: the read's ledger part.
                insert(client, 0, BLOCK, "now64(6) - toIntervalSecond(30)", "now64(6)")
                since = client.query(f"SELECT {queries.SINCE}").result_rows[0][0]
                start, end = window_bounds("month", since)
                held = BLOCK
            else:
                # As in a ledger migrated long ago: the daily sums hold every row.
                client.command(f"TRUNCATE TABLE {queries.DAILY_SINCE_TABLE}")
                client.command(
                    f"INSERT INTO {queries.DAILY_SINCE_TABLE} VALUES ('2000-01-01 00:00:00')"
                )
                start, end = MONTH, MONTH + timedelta(days=31)
                held = 0
            budgets = [
                queries.SpendFilter(start=start, end=end),
                queries.SpendFilter(start=start, end=end, virtual_key_id="vk_3"),
            ]
            # As the control plane reads: knowing when the sums began (a month and more before
            # the window here, so the ledger's own rows are left out; on a first day, not).
            since = client.query(f"SELECT {queries.SINCE}").result_rows[0][0]
            daily = queries.spend("org_bench", budgets, since)
            unindexed = daily.sql + " SETTINGS use_skip_indexes = 0"
            final_parameters = {"org": "org_bench", "s": start, "e": end, "v": "vk_3"}
            print(
                f"{'ledger rows':>11}  {'daily rows':>10}  {'daily sums ms':>13}  "
                + (f"{'no skip index ms':>16}  " if args.first_day else "")
                + f"{'FINAL ms':>8}"
            )
            for rows in steps:
                if rows > held:
                    if args.first_day:
                        fill_first_day(client, held, rows - held, steps[-1])
                    else:
                        fill(client, held, rows - held)
                    held = rows
                kept = client.query("SELECT count() FROM ledger_spend_daily").result_rows[0][0]
                daily_ms, from_daily = timed(client, daily.sql, daily.parameters, args.reads)
                plain = ""
                if args.first_day:
                    plain_ms, from_plain = timed(client, unindexed, daily.parameters, args.reads)
                    if from_plain != from_daily:
                        raise SystemExit(f"the reads disagree: {from_daily} != {from_plain}")
                    plain = f"{plain_ms:>16.1f}  "
                final_ms, from_rows = timed(client, FINAL_READ, final_parameters, args.reads)
                if from_daily != from_rows:
                    raise SystemExit(f"the reads disagree: {from_daily} != {from_rows}")
                print(f"{rows:>11,}  {kept:>10,}  {daily_ms:>13.1f}  {plain}{final_ms:>8.1f}")
        finally:
            client.close()


if __name__ == "__main__":
    main()
