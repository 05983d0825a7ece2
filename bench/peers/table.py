#!/usr/bin/env python3
"""Render the rows of a bench/run.sh run as tables.

  table.py ROWS.tsv HEADER.txt OUT_BASE   -> prints them, writes OUT_BASE.txt and OUT_BASE.tsv

Row columns (tab-separated): target mode conc rps p50_ms p99_ms requests errors_non2xx
errors_socket cpu_pct [aux_cpu_pct [steal_pct]]. cpu_pct -1: the target failed its sanity check
or did not start. aux_cpu_pct: CPU of a helper process the target needs (vkgate's control
plane), empty when there is none. steal_pct: the share of the machine's CPU time its hypervisor
gave to other guests during the run (time no process here got), empty when not measured.

Prints, in order: the run header, one line per run (every mode and concurrency), the summary
(one line per target) and the ratios between targets measured in this same run.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

DIRECT = "direct-nginx"
# (numerator, denominator, label) of the ratios block; a pair missing from the run is skipped.
RATIOS = (
    ("vkgate-w1", "litellm-w1", "vkgate 1 worker / LiteLLM 1 worker"),
    ("vkgate-w2", "litellm-w2", "vkgate 2 workers / LiteLLM 2 workers"),
    ("vkgate-w1", "portkey", "vkgate 1 worker / Portkey"),
    ("vkgate-w1", "bare-forwarder", "vkgate 1 worker / ceiling (bare forwarder)"),
    ("vkgate-w2", "bare-forwarder-w2", "vkgate 2 workers / ceiling 2 workers"),
    ("vkgate-w2", "vkgate-w1", "vkgate 2 workers / vkgate 1 worker"),
    ("bare-forwarder-w2", "bare-forwarder", "ceiling 2 workers / ceiling 1 worker"),
    ("bare-forwarder", DIRECT, "ceiling (bare forwarder) / nginx direct"),
    (
        "vkgate-w1-bedrock",
        "vkgate-w1",
        "Bedrock (translated, signed) / chat pass-through, 1 worker",
    ),
    ("vkgate-w1-gemini", "vkgate-w1", "Gemini (translated) / chat pass-through, 1 worker"),
    ("vkgate-w1-cached", "vkgate-w1", "cache hits / uncached governed, 1 worker"),
    ("vkgate-w2-cached", "vkgate-w2", "cache hits / uncached governed, 2 workers"),
)


@dataclass
class Row:
    target: str
    mode: str
    conc: str
    rps: float
    p50: float
    p99: float
    requests: int
    errors: int
    cpu: int
    aux_cpu: int | None
    steal: float | None = None
    """% of the machine's CPU time taken by its hypervisor during the run."""

    @property
    def not_run(self) -> bool:
        return self.cpu < 0

    @property
    def failed(self) -> bool:
        """Nothing succeeded: the speed of error replies means nothing."""
        return self.not_run or (self.requests > 0 and self.errors >= self.requests)


def num(text: str) -> float:
    return float(text) if text not in ("", "nan", "-") else math.nan


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def parse(text: str) -> list[Row]:
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("\t")
        target, mode, conc, rps, p50, p99, requests, non2xx, sockerr, cpu = fields[:10]
        aux = fields[10] if len(fields) > 10 else ""
        steal = fields[11] if len(fields) > 11 else ""
        row = Row(
            target=target,
            mode=mode,
            conc=conc,
            rps=num(rps),
            p50=num(p50),
            p99=num(p99),
            requests=int(requests or 0),
            errors=int(non2xx or 0) + int(sockerr or 0),
            cpu=int(cpu),
            aux_cpu=int(aux) if aux not in ("", "-") else None,
            steal=float(steal) if steal not in ("", "-") else None,
        )
        if row.failed:
            row.rps = row.p50 = row.p99 = math.nan
        rows.append(row)
    return rows


def details(rows: list[Row], direct: dict[tuple[str, str], Row]) -> list[str]:
    head = (
        f"{'target':<18} {'mode':<6} {'conc':>4} {'RPS':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'+p50 ms':>8} {'+p99 ms':>8} {'RPS %dir':>8} {'cpu%':>5} {'cp%':>4} {'st%':>4} "
        f"{'errors':>12}"
    )
    out = [head, "-" * len(head)]
    for row in rows:
        base = None if row.target == DIRECT else direct.get((row.mode, row.conc))
        added_p50 = None if base is None else row.p50 - base.p50
        added_p99 = None if base is None else row.p99 - base.p99
        share = None if base is None or not base.rps else 100.0 * row.rps / base.rps
        if row.not_run:
            errors = "NOT RUN"
        elif row.errors:
            errors = f"{'ALL ' if row.failed else ''}{row.errors}/{row.requests}"
        else:
            errors = "0"
        cpu = str(row.cpu) if row.cpu >= 0 else "-"
        aux = str(row.aux_cpu) if row.aux_cpu is not None else "-"
        steal = fmt(row.steal, 1)
        out.append(
            f"{row.target:<18} {row.mode:<6} {row.conc:>4} {fmt(row.rps, 0):>9} "
            f"{fmt(row.p50):>8} {fmt(row.p99):>8} {fmt(added_p50):>8} {fmt(added_p99):>8} "
            f"{fmt(share, 1):>8} {cpu:>5} {aux:>4} {steal:>4} {errors:>12}"
        )
    return out


def summary(rows: list[Row], direct: dict[tuple[str, str], Row]) -> list[str]:
    targets = list(dict.fromkeys(row.target for row in rows))
    found = {(row.target, row.mode, row.conc): row for row in rows}
    concs = sorted({int(row.conc) for row in rows if row.mode == "chat" and row.conc.isdigit()})
    streams = sorted({row.conc for row in rows if row.mode == "stream"}, key=int)
    responses = sorted({row.conc for row in rows if row.mode == "responses"}, key=int)
    if not concs:
        return []
    low, high = str(concs[0]), str(concs[-1])

    def cell(target: str, mode: str, conc: str, what: str) -> str:
        row = found.get((target, mode, conc))
        if row is None or row.not_run:
            return "-"
        if row.failed:
            return "failed"
        mark = "*" if row.errors else ""
        if what == "rps":
            return f"{row.rps:,.0f}{mark}"
        if what == "cpu":
            return str(row.cpu)
        if what == "cost":
            # % of one core over requests a second: µs of the target's CPU per request.
            return f"{row.cpu * 10_000 / row.rps:.0f}" if row.rps else "-"
        if what == "aux":
            return "-" if row.aux_cpu is None else str(row.aux_cpu)
        base = direct.get((mode, conc))
        if target == DIRECT or base is None:
            return "-"
        value = getattr(row, what) - getattr(base, what)
        return f"{value:.2f}{mark}"

    heads = [f"c={low} RPS", f"added p50 / p99 at c={low} (ms)"]
    heads += [f"c={c} RPS" for c in concs[1:]]
    if high != low:
        heads.append(f"added p99 at c={high} (ms)")
    for conc in streams:
        heads += [f"stream c={conc} RPS", f"stream added p50 at c={conc} (ms)"]
    for conc in responses:
        heads += [f"responses c={conc} RPS", f"responses added p50 at c={conc} (ms)"]
    heads += [
        "seq RPS",
        "seq added p50 (ms)",
        f"cpu% at c={high}",
        f"cpu µs/request at c={high}",
        f"control plane cpu% at c={high}",
    ]
    out = ["| target | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for target in targets:
        cells = [
            cell(target, "chat", low, "rps"),
            f"{cell(target, 'chat', low, 'p50')} / {cell(target, 'chat', low, 'p99')}",
        ]
        cells += [cell(target, "chat", str(c), "rps") for c in concs[1:]]
        if high != low:
            cells.append(cell(target, "chat", high, "p99"))
        for conc in streams:
            cells += [cell(target, "stream", conc, "rps"), cell(target, "stream", conc, "p50")]
        for conc in responses:
            cells += [
                cell(target, "responses", conc, "rps"),
                cell(target, "responses", conc, "p50"),
            ]
        cells += [
            cell(target, "seq", "1", "rps"),
            cell(target, "seq", "1", "p50"),
            cell(target, "chat", high, "cpu"),
            cell(target, "chat", high, "cost"),
            cell(target, "chat", high, "aux"),
        ]
        if any(row.not_run for row in rows if row.target == target):
            cells = ["NOT RUN"] + ["-"] * (len(cells) - 1)
        out.append(f"| {target} | " + " | ".join(cells) + " |")
    return out


def ratios(rows: list[Row]) -> list[str]:
    rps = {(row.target, row.mode, row.conc): row.rps for row in rows}
    targets = {row.target for row in rows if not row.not_run}
    columns = [("chat", c) for c in sorted({r.conc for r in rows if r.mode == "chat"}, key=_int)]
    columns += [("stream", c) for c in sorted({r.conc for r in rows if r.mode == "stream"})]
    columns += [("responses", c) for c in sorted({r.conc for r in rows if r.mode == "responses"})]
    columns += [("seq", "1")]
    heads = [
        f"c={c}" if m == "chat" else ("seq" if m == "seq" else f"{m} c={c}") for m, c in columns
    ]
    out = ["| RPS ratio | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for top, bottom, label in RATIOS:
        if top not in targets or bottom not in targets:
            continue
        cells = []
        for mode, conc in columns:
            a, b = rps.get((top, mode, conc), math.nan), rps.get((bottom, mode, conc), math.nan)
            cells.append("-" if math.isnan(a) or math.isnan(b) or not b else f"{a / b:.2f}x")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out if len(out) > 2 else []


def responses_line(rows: list[Row]) -> list[str]:
    """Each target's Responses API pass-through against its chat completions, at the same
    concurrency: the Responses route's own cost (a sealed id per answer)."""
    rps = {(row.target, row.mode, row.conc): row.rps for row in rows if not row.not_run}
    out = []
    for (target, mode, conc), value in rps.items():
        chat = rps.get((target, "chat", conc))
        if mode == "responses" and chat:
            out.append(f"{target}: responses / chat RPS at c={conc}: {value / chat:.2f}")
    return out


def steal_line(rows: list[Row]) -> str:
    """How much CPU the hypervisor took during the runs: the same build measures slower on a
    busier host, so runs taken on different days compare only alongside this."""
    stolen = sorted(row.steal for row in rows if row.steal is not None and not row.not_run)
    if not stolen:
        return ""
    median = stolen[len(stolen) // 2]
    return (
        f"CPU time taken by the hypervisor (steal) during the runs: {stolen[0]:.1f}-"
        f"{stolen[-1]:.1f} % of the machine's, median {median:.1f} %."
    )


def _int(text: str) -> int:
    return int(text) if text.isdigit() else -1


def main() -> None:
    rows_path, header_path, out_base = sys.argv[1:4]
    with open(rows_path) as source:
        rows_text = source.read()
    with open(header_path) as source:
        header = source.read().rstrip()
    rows = parse(rows_text)
    direct = {(row.mode, row.conc): row for row in rows if row.target == DIRECT}
    out = [header, "", *details(rows, direct)]
    out += [
        "+p50/+p99: latency added vs direct-nginx at the same mode/concurrency; RPS %dir: share of",
        "direct RPS; cpu%: CPU of the target's process tree during the run (100 = one core); cp%:",
        "CPU of vkgate's control plane (spend ingestion, on the same cores); seq: sequential",
        "requests; st%: share of the machine's CPU time its hypervisor gave to other guests",
        "during the run (noise no target caused); errors: non-2xx + socket errors / requests",
        "(ALL: every reply failed, no speed).",
    ]
    stolen = steal_line(rows)
    if stolen:
        out += ["", stolen]
    table = summary(rows, direct)
    if table:
        out += ["", "Summary (added = latency added vs nginx direct at the same concurrency):", ""]
        out += table
        if any(row.errors and not row.failed for row in rows):
            out.append("* some requests of that run failed (see the errors column above)")
    block = ratios(rows)
    if block:
        out += ["", "RPS ratios, measured side by side in this run (>1: the first is faster):", ""]
        out += block
    passed_through = responses_line(rows)
    if passed_through:
        out += ["", *passed_through]
    text = "\n".join(out)
    print(text)
    with open(out_base + ".txt", "w") as sink:
        sink.write(text + "\n")
    if os.path.abspath(rows_path) != os.path.abspath(out_base + ".tsv"):
        with open(out_base + ".tsv", "w") as sink:
            sink.write(rows_text)


if __name__ == "__main__":
    main()
