"""Spend ingestion throughput on embedded chDB: rows per second by segment size.

For each segment size, ships fresh segments of that many records (half admits, half priced
outcomes over a few models, ~600 bytes each, as a busy proxy writes them) and times:
- "end to end": decode the JSON body, check every record, price the outcomes, look up which ids
  the ledger holds, insert, and announce the budgets moved (the `spend-commands` handler's work
  without HTTP; SQLite in a temporary directory holds the providers and the feed);
- "ledger write": the id lookup and the insert alone;
- "re-ship": the same segment again, all duplicates (what a proxy retry costs).

With `--together N`, it then ships N fresh segments of each size at once, each from a replica of
its own (as the workers of many replicas ship theirs), and times the ledger writes of all N
("N at once"): writes asked for while one is under way go together as one.

    .venv/bin/python bench/ledger_ingest.py [--sizes 1000,10000] [--segments 5]
    .venv/bin/python bench/ledger_ingest.py --sizes 20,200 --together 10,20

Rows per second count every record of a segment (admits too).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

from controlplane.db import Database, create_engine
from controlplane.feed.service import FeedNotifier
from controlplane.ledger.migrate import upgrade as upgrade_ledger
from controlplane.ledger.store import Ledger
from controlplane.migrate import upgrade
from controlplane.models import Budget, Organization, Provider
from controlplane.settings import LedgerLocation
from controlplane.spend import segments, service
from controlplane.spend.pricing import Pricer
from vkgate.clock import SystemClock, rfc3339
from vkgate.spend import SpendRecord, SpendSegment

MODELS = [
    ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
    ("gpt-4o-2024-08-06", "gpt-4o"),
    ("o3-mini", "o3-mini"),
]


@dataclass(frozen=True)
class Sample:
    size: int
    end_to_end_s: float
    write_s: float
    reship_s: float
    body_bytes: int


def make_segment(size: int, org: str, provider: str, start: datetime) -> SpendSegment:
    replica = "bench-replica"
    records: list[SpendRecord] = []
    for i in range(size // 2):
        at = start + timedelta(microseconds=i * 250)
        request_id = uuid.uuid4().hex
        served, upstream = MODELS[i % len(MODELS)]
        common: dict[str, Any] = {
            "replica_id": replica,
            "request_id": request_id,
            "route": "/v1/chat/completions",
        }
        records.append(
            SpendRecord(id=uuid.uuid4().hex, kind="admit", seq=2 * i + 1, at=rfc3339(at), **common)
        )
        records.append(
            SpendRecord(
                id=uuid.uuid4().hex,
                kind="confirm",
                seq=2 * i + 2,
                at=rfc3339(at + timedelta(milliseconds=300)),
                organization_id=org,
                team_id="team_bench",
                project_id="proj_bench",
                virtual_key_id=f"vk_bench_{i % 50}",
                end_user=f"user-{i % 200}",
                model="chat",
                upstream_model=upstream,
                served_model=served,
                provider_id=provider,
                provider_kind="openai",
                status=200,
                attempts=1,
                input_tokens=800 + i % 1000,
                cache_read_tokens=(i % 5) * 100,
                output_tokens=120 + i % 300,
                usage_source="provider",
                latency_ms=412.5,
                ttfb_ms=88.0,
                **common,
            )
        )
    return SpendSegment(replica_id=replica, segment_id=uuid.uuid4().hex, records=records)


async def seed(db: Database) -> tuple[str, str]:
    now = datetime.now(UTC)
    async with db.transaction() as session:
        session.add(Organization(id="org_bench", name="bench", created_at=now))
        session.add(
            Provider(
                id="prov_bench",
                organization_id="org_bench",
                name="openai",
                kind="openai",
                base_url="https://api.openai.com/v1",
                api_version=None,
                api_key_encrypted=None,
                headers_encrypted=None,
                header_names=[],
                price_overrides={},
                created_at=now,
                updated_at=now,
            )
        )
        await session.flush()
        session.add(
            Budget(
                id="bud_bench",
                organization_id="org_bench",
                name=None,
                scope_kind="organization",
                scope_id="org_bench",
                window="month",
                limit_nano_usd=10**15,
                provider_id=None,
                on_breach="block",
                created_at=now,
                updated_at=now,
            )
        )
    return "org_bench", "prov_bench"


async def run(sizes: list[int], rounds: int, directory: Path) -> list[Sample]:
    url = f"sqlite:///{directory / 'controlplane.db'}"
    upgrade(url)
    location = LedgerLocation(kind="chdb", path=directory / "ledger")
    upgrade_ledger(location)
    db = Database(create_engine(url))
    ledger = Ledger(location)
    pricer, clock, notifier = Pricer(), SystemClock(), FeedNotifier()
    org, provider = await seed(db)
    samples = []
    start = datetime.now(UTC) - timedelta(hours=1)
    try:
        for size in sizes:
            for _ in range(rounds):
                body = msgspec.json.encode(make_segment(size, org, provider, start))
                start += timedelta(minutes=1)

                began = time.perf_counter()
                checked = segments.check(segments.decode(body))
                ack = await service.ingest(
                    checked, db=db, ledger=ledger, pricer=pricer, clock=clock, notifier=notifier
                )
                end_to_end = time.perf_counter() - began
                assert ack.accepted == size, ack

                again = segments.check(segments.decode(body))
                began = time.perf_counter()
                ack = await service.ingest(
                    again, db=db, ledger=ledger, pricer=pricer, clock=clock, notifier=notifier
                )
                reship = time.perf_counter() - began
                assert ack.duplicates == size, ack

                fresh = segments.check(
                    segments.decode(msgspec.json.encode(make_segment(size, org, provider, start)))
                )
                start += timedelta(minutes=1)
                priced = service._price(pricer, fresh.outcomes, {})
                began = time.perf_counter()
                await ledger.write(priced, fresh.admits, clock.now())
                write = time.perf_counter() - began
                samples.append(Sample(size, end_to_end, write, reship, len(body)))
    finally:
        await ledger.close()
        await db.close()
    return samples


def replica_segment(size: int, replica: str, org: str, provider: str, at: datetime) -> Any:
    """A checked, priced segment of `size` records from `replica`."""
    made = make_segment(size, org, provider, at)
    records = [msgspec.structs.replace(r, replica_id=replica) for r in made.records]
    made = msgspec.structs.replace(made, replica_id=replica, records=records)
    return segments.check(segments.decode(msgspec.json.encode(made)))


async def together(
    sizes: list[int], counts: list[int], rounds: int, directory: Path
) -> list[tuple[int, int, float, float]]:
    """(size, count, wall s, process CPU s), medians over `rounds`, of `count` writes at once."""
    location = LedgerLocation(kind="chdb", path=directory / "ledger-together")
    upgrade_ledger(location)
    ledger, pricer = Ledger(location), Pricer()
    start = datetime.now(UTC) - timedelta(hours=1)
    found = []
    try:
        for size in sizes:
            for count in counts:
                times = []
                for _ in range(rounds):
                    checked = [
                        replica_segment(size, f"replica-{n}", "org_bench", "prov_bench", start)
                        for n in range(count)
                    ]
                    start += timedelta(minutes=1)
                    priced = [(service._price(pricer, c.outcomes, {}), c.admits) for c in checked]
                    now = datetime.now(UTC)
                    began, cpu = time.perf_counter(), time.process_time()
                    written = await asyncio.gather(*(ledger.write(p, a, now) for p, a in priced))
                    times.append((time.perf_counter() - began, time.process_time() - cpu))
                    assert all(len(w.rows) + w.admits == size for w in written), written
                found.append(
                    (
                        size,
                        count,
                        statistics.median(t[0] for t in times),
                        statistics.median(t[1] for t in times),
                    )
                )
    finally:
        await ledger.close()
    return found


def table(samples: list[Sample]) -> str:
    header = (
        f"{'records/segment':>15}  {'body MB':>7}  {'end to end rows/s':>17}  "
        f"{'ms/segment':>10}  {'ledger write rows/s':>19}  {'re-ship ms':>10}"
    )
    lines = [header, "-" * len(header)]
    for size in sorted({s.size for s in samples}):
        chosen = [s for s in samples if s.size == size]
        e2e = statistics.median(s.end_to_end_s for s in chosen)
        write = statistics.median(s.write_s for s in chosen)
        reship = statistics.median(s.reship_s for s in chosen)
        body_mb = chosen[0].body_bytes / 1e6
        lines.append(
            f"{size:>15,}  {body_mb:>7.2f}  {size / e2e:>17,.0f}  {e2e * 1000:>10.1f}  "
            f"{size / write:>19,.0f}  {reship * 1000:>10.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="1000,10000", help="records per segment, comma list")
    parser.add_argument("--segments", type=int, default=5, help="segments shipped per size")
    parser.add_argument("--together", default="", help="segments shipped at once, comma list")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    counts = [int(n) for n in args.together.split(",") if n]
    with tempfile.TemporaryDirectory(prefix="vkgate-ledger-bench-") as directory:
        samples = asyncio.run(run(sizes, args.segments, Path(directory)))
        found = asyncio.run(together(sizes, counts, args.segments, Path(directory)))
    print(f"spend ingestion on embedded chDB, median of {args.segments} segments per size")
    print(table(samples))
    if found:
        print(f"\nsegments shipped at once, ledger writes only, median of {args.segments} rounds")
        print(
            f"{'records/segment':>15}  {'at once':>7}  {'wall ms':>8}  {'CPU ms':>8}  {'CPU ms/segment':>14}"
        )
        for size, count, wall, cpu in found:
            print(
                f"{size:>15,}  {count:>7}  {wall * 1000:>8.0f}  {cpu * 1000:>8.0f}  "
                f"{cpu * 1000 / count:>14.1f}"
            )


if __name__ == "__main__":
    main()
