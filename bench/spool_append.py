"""What the spend spool costs: µs per `append` (the hot path, twice per request), per seal, and
per segment read back for shipping. Prints a table; asserts nothing.

Runs on real files in a temporary directory (`--dir` to choose where: the spool's fsync costs
what the file system under it makes it cost; tmpfs would hide it). Bounded: a fixed number of
records per case.

    .venv/bin/python bench/spool_append.py [--records 50000] [--dir /var/lib/vkgate]

For scale, the primitives one append is made of are measured alone as well: the record's id,
its timestamp, the msgspec encoding, the CRC, and a bare `os.write` of a line that size.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import msgspec

from proxy.spend.spool import SpendSpool, _Ids, rfc3339_micro
from vkgate.clock import SystemClock
from vkgate.spend import SpendRecord


def admit() -> SpendRecord:
    return SpendRecord(
        id="",
        kind="admit",
        replica_id="",
        seq=0,
        request_id="5f1c0c6e4b7d4a0f9c2e8d1a3b6f7e90",
        at="",
        route="/v1/chat/completions",
    )


def confirm() -> SpendRecord:
    return SpendRecord(
        id="",
        kind="confirm",
        replica_id="",
        seq=0,
        request_id="5f1c0c6e4b7d4a0f9c2e8d1a3b6f7e90",
        at="",
        route="/v1/chat/completions",
        organization_id="org_01JABCDEFGHJKMNPQRSTVWXYZ",
        team_id="team_01JABCDEFGHJKMNPQRSTVWXYZ",
        project_id="proj_01JABCDEFGHJKMNPQRSTVWXYZ",
        virtual_key_id="vk_01JABCDEFGHJKMNPQRSTVWXYZ",
        end_user="user-48151623",
        model="chat",
        served_model="gpt-4o-mini-2024-07-18",
        upstream_model="gpt-4o-mini",
        provider_id="prov_01JABCDEFGHJKMNPQRSTVWXYZ",
        provider_kind="openai",
        status=200,
        stream=True,
        attempts=1,
        input_tokens=1834,
        output_tokens=412,
        cache_read_tokens=1024,
        usage_source="provider",
        latency_ms=1843.221,
        ttfb_ms=302.554,
    )


def per_call_us(fn: Callable[[], object], count: int) -> float:
    """Median of five runs of `count` calls, in µs per call."""
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(count):
            fn()
        runs.append((time.perf_counter() - started) / count * 1e6)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    count: int = args.records
    rows: list[tuple[str, str]] = []

    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        root = Path(scratch)
        spool = SpendSpool.open(root / "spool", SystemClock(), max_bytes=1 << 40)
        for name, make in (("admit", admit), ("confirm, every field", confirm)):
            record = make()
            spool.append(record)
            size = len(msgspec.json.encode(record)) + 10  # with its checksum and newline
            # One record object reused: `append` re-stamps it, as the gateway's two calls do.
            us = per_call_us(lambda r=record: spool.append(r), count)  # type: ignore[misc]
            rows.append((f"append: {name} ({size} B line)", f"{us:.2f}"))
            spool.seal()
            for segment in spool.pending_segments():
                spool.acknowledge(segment, SpendSpool.load(segment))

        record = confirm()
        for records in (1, 100, 1000):
            timings = []
            for _ in range(20):
                for _ in range(records):
                    spool.append(record)
                started = time.perf_counter()
                spool.seal()
                timings.append((time.perf_counter() - started) * 1e6)
            rows.append(
                (
                    f"seal: {records} record(s) (fsync, mark, rename)",
                    f"{statistics.median(timings):.0f}",
                )
            )
            for segment in spool.pending_segments():
                spool.acknowledge(segment, SpendSpool.load(segment))

        for _ in range(2000):
            spool.append(record)
        spool.seal()
        segment = spool.pending_segments()[0]  # a full segment (512 KiB)
        started = time.perf_counter()
        loaded = SpendSpool.load(segment)
        load_us = (time.perf_counter() - started) * 1e6
        rows.append((f"load for shipping: {loaded.records} records, CRC only", f"{load_us:.0f}"))
        segment.ours = False  # as a previous process's segment: every line decoded again
        started = time.perf_counter()
        SpendSpool.load(segment)
        rows.append(
            (
                "load for shipping: same, every line decoded",
                f"{(time.perf_counter() - started) * 1e6:.0f}",
            )
        )
        spool.close()

        ids = _Ids()
        clock = SystemClock()
        now = clock.now()
        encoder = msgspec.json.Encoder()
        buffer = bytearray(1024)
        stamped = confirm()
        stamped.id, stamped.replica_id, stamped.seq, stamped.at = "0" * 32, "a" * 16, 1, "x" * 27
        line = encoder.encode(stamped) + b" 00000000\n"
        fd = os.open(root / "raw", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        rows += [
            ("  part: id (pooled uuid4 hex)", f"{per_call_us(ids.next, count):.2f}"),
            ("  part: clock.now()", f"{per_call_us(clock.now, count):.2f}"),
            ("  part: timestamp text", f"{per_call_us(lambda: rfc3339_micro(now), count):.2f}"),
            (
                "  part: msgspec encode_into",
                f"{per_call_us(lambda: encoder.encode_into(stamped, buffer), count):.2f}",
            ),
            ("  part: CRC-32 of the line", f"{per_call_us(lambda: zlib.crc32(line), count):.2f}"),
            (
                "  part: os.write of the line",
                f"{per_call_us(lambda: os.write(fd, line), count):.2f}",
            ),
        ]
        os.close(fd)

    width = max(len(name) for name, _ in rows)
    print(f"{'spool operation':<{width}}  µs")
    print(f"{'-' * width}  ------")
    for name, value in rows:
        print(f"{name:<{width}}  {value:>6}")


if __name__ == "__main__":
    main()
