"""The soak's periodic row: the load run, with a table row every interval.

Each row holds the interval's `Window` from the generator, the proxy's and the control plane's
RSS, and the CPU share of one core of every process (`Sampler`), the generator's own included.
`run_load` drives the generator and prints the table as it goes.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from dataclasses import dataclass

import stack
from soak_traffic import Generator, Window

MIB = 1024 * 1024


# -- the periodic row ------------------------------------------------------------------------


def generator_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class Row:
    elapsed: float
    window: Window
    proxy_rss: int
    controlplane_rss: int
    cpu: dict[str, float]
    """Process name -> share of one core over the interval, in percent."""
    in_flight: int

    @property
    def ended(self) -> int:
        return sum(self.window.classes.values())

    @property
    def errors(self) -> int:
        return self.window.classes["5xx"] + self.window.classes["err"]


HEADERS = (
    "elapsed s",
    "sent",
    "2xx",
    "4xx",
    "5xx",
    "transport err",
    "error rate",
    "p50 ms",
    "p99 ms",
    "proxy RSS MiB",
    "CP RSS MiB",
    "proxy CPU %",
    "CP CPU %",
    "upstream CPU %",
    "generator CPU %",
    "in flight",
    "max send lag ms",
)


def render(row: Row) -> list[str]:
    w = row.window
    rate = row.errors / row.ended if row.ended else 0.0
    sent = f"{w.sent:,}" + (f" (+{w.skipped:,} skipped)" if w.skipped else "")
    return [
        f"{row.elapsed:.0f}",
        sent,
        f"{w.classes['2xx']:,}",
        f"{w.classes['4xx']:,}",
        f"{w.classes['5xx']:,}",
        f"{w.classes['err']:,}",
        f"{rate:.2%}",
        f"{stack.percentile(w.latencies, 50) * 1000:.1f}",
        f"{stack.percentile(w.latencies, 99) * 1000:.1f}",
        f"{row.proxy_rss / MIB:.1f}",
        f"{row.controlplane_rss / MIB:.1f}",
        f"{row.cpu['proxy']:.0f}",
        f"{row.cpu['controlplane']:.0f}",
        f"{row.cpu['upstream']:.0f}",
        f"{row.cpu['generator']:.0f}",
        f"{row.in_flight}",
        f"{w.max_lag_s * 1000:.1f}",
    ]


def print_line(cells: list[str] | tuple[str, ...]) -> None:
    print("| " + " | ".join(cells) + " |", flush=True)


class Sampler:
    """CPU time of each process between two readings."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.last = self._read()

    def _read(self) -> tuple[float, dict[str, float]]:
        cpu = {name: stack.cpu_seconds(pid) for name, pid in self.pids.items()}
        cpu["generator"] = generator_cpu_seconds()
        return time.monotonic(), cpu

    def shares(self) -> dict[str, float]:
        (t0, before), (t1, after) = self.last, self._read()
        self.last = (t1, after)
        wall = max(t1 - t0, 1e-9)
        return {name: (after[name] - before[name]) / wall * 100 for name in after}


async def report_every(
    generator: Generator,
    sampler: Sampler,
    pids: dict[str, int],
    interval: float,
    seconds: float,
    rows: list[Row],
) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    k = 1
    while True:
        at = min(k * interval, seconds)
        await asyncio.sleep(max(start + at - loop.time(), 0))
        row = Row(
            elapsed=loop.time() - start,
            window=generator.take_window(),
            proxy_rss=stack.rss_bytes(pids["proxy"]),
            controlplane_rss=stack.rss_bytes(pids["controlplane"]),
            cpu=sampler.shares(),
            in_flight=generator.in_flight,
        )
        rows.append(row)
        print_line(render(row))
        if at >= seconds:
            return
        k += 1


async def soak(
    generator: Generator, pids: dict[str, int], args: argparse.Namespace, rows: list[Row]
) -> None:
    seconds = args.minutes * 60
    sampler = Sampler(pids)
    print_line(HEADERS)
    print("|" + "---|" * len(HEADERS), flush=True)
    reporter = asyncio.create_task(
        report_every(generator, sampler, pids, args.interval, seconds, rows)
    )
    try:
        await generator.drive(seconds)
        await reporter
        # Answers that came after the last row (the requests still in flight then).
        late = generator.take_window()
        if late.classes:
            rows.append(
                Row(
                    seconds,
                    late,
                    stack.rss_bytes(pids["proxy"]),
                    stack.rss_bytes(pids["controlplane"]),
                    sampler.shares(),
                    generator.in_flight,
                )
            )
            print_line(["after", *render(rows[-1])[1:]])
    finally:
        reporter.cancel()


def run_load(generator: Generator, pids: dict[str, int], args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        asyncio.run(soak(generator, pids, args, rows))
    else:
        uvloop.run(soak(generator, pids, args, rows))
    return rows
