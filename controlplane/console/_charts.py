"""Charts drawn on the server as SVG: no chart script, nothing inline for the CSP to allow.

Coordinates are floats (drawing needs no more); every amount a chart shows in text is the
ledger's exact decimal string, given by the caller."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape

from markupsafe import Markup

COLOURS = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#ff7f0e",
)
"""The legend's `.swN` classes in console.css use the same colours in the same order."""
WIDTH, HEIGHT = 960, 280
LEFT, RIGHT, TOP, BOTTOM = 78, 16, 14, 40


@dataclass(frozen=True, slots=True)
class Segment:
    series: int
    """Index into the legend (and COLOURS)."""
    nanos: int
    label: str
    """What hovering the bar says: the group, the day and the exact amount."""


def _usd_tick(nanos: float) -> str:
    usd = nanos / 1e9
    if usd == 0:
        return "$0"
    if usd >= 100:
        return f"${usd:,.0f}"
    if usd >= 1:
        return f"${usd:,.2f}"
    return f"${usd:.6f}".rstrip("0")


def _scale(top: float) -> float:
    """A round value at or above `top` for the y axis."""
    if top <= 0:
        return 1.0
    magnitude = 10 ** (len(str(int(top))) - 1) if top >= 1 else 1
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= top:
            return float(step * magnitude)
    return float(10 * magnitude)


def _frame(title: str, top: float, labels: Sequence[str]) -> list[str]:
    plot_h = HEIGHT - TOP - BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
    ]
    for i in range(5):
        y = TOP + plot_h - plot_h * i / 4
        parts.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#d4d9e0"/>'
        )
        parts.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="12" '
            f'fill="#4a5360">{escape(_usd_tick(top * i / 4))}</text>'
        )
    slot = (WIDTH - LEFT - RIGHT) / max(1, len(labels))
    every = max(1, len(labels) // 12)
    for i, label in enumerate(labels):
        if i % every == 0:
            x = LEFT + slot * (i + 0.5)
            parts.append(
                f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle" '
                f'font-size="12" fill="#4a5360">{escape(label)}</text>'
            )
    return parts


def stacked_bars(title: str, days: Sequence[str], stacks: Sequence[Sequence[Segment]]) -> Markup:
    """One bar a day, stacked by group; `stacks[i]` are day i's segments."""
    totals = [sum(s.nanos for s in stack) for stack in stacks]
    top = _scale(max(totals, default=0))
    plot_h = HEIGHT - TOP - BOTTOM
    parts = _frame(title, top, [d[5:] for d in days])
    slot = (WIDTH - LEFT - RIGHT) / max(1, len(days))
    bar = max(2.0, slot * 0.7)
    for i, stack in enumerate(stacks):
        x = LEFT + slot * i + (slot - bar) / 2
        y = float(TOP + plot_h)
        for segment in stack:
            if segment.nanos <= 0:
                continue
            h = plot_h * segment.nanos / top
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{max(h, 0.5):.1f}" '
                f'fill="{COLOURS[segment.series % len(COLOURS)]}">'
                f"<title>{escape(segment.label)}</title></rect>"
            )
    parts.append(
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - RIGHT}" y2="{TOP + plot_h}" '
        'stroke="#4a5360"/>'
    )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - every text inside is escaped above


def burn_down(
    title: str,
    days: Sequence[datetime],
    cumulative: Sequence[int],
    limit_nanos: int,
    reach_index: float | None,
) -> Markup:
    """Spend to date (line), the limit (dashed), and the pace so far carried on (dotted) to
    the day the limit is reached or the window's end."""
    labels = [d.strftime("%m-%d") for d in days]
    spent = cumulative[-1] if cumulative else 0
    pace = spent / max(1, len(cumulative))
    projected_end = spent + pace * (len(days) - len(cumulative))
    top = _scale(max(limit_nanos, spent, min(projected_end, limit_nanos * 1.5)) * 1.05)
    plot_h = HEIGHT - TOP - BOTTOM
    parts = _frame(title, top, labels)
    slot = (WIDTH - LEFT - RIGHT) / max(1, len(days))

    def point(i: float, nanos: float) -> str:
        x = LEFT + slot * (i + 1)
        y = TOP + plot_h - plot_h * min(nanos, top) / top
        return f"{x:.1f},{y:.1f}"

    limit_y = TOP + plot_h - plot_h * min(limit_nanos, top) / top
    parts.append(
        f'<line x1="{LEFT}" y1="{limit_y:.1f}" x2="{WIDTH - RIGHT}" y2="{limit_y:.1f}" '
        'stroke="#a4161a" stroke-width="2" stroke-dasharray="8 5"/>'
    )
    parts.append(
        f'<text x="{WIDTH - RIGHT - 4}" y="{limit_y - 6:.1f}" text-anchor="end" font-size="12" '
        'fill="#a4161a">limit</text>'
    )
    line = [f"{LEFT:.1f},{TOP + plot_h:.1f}"] + [point(i, n) for i, n in enumerate(cumulative)]
    parts.append(
        f'<polyline points="{" ".join(line)}" fill="none" stroke="#0b5cad" stroke-width="3"/>'
    )
    if cumulative and len(cumulative) < len(days):
        last = len(cumulative) - 1
        ends_at = len(days) - 1 if reach_index is None else min(reach_index, len(days) - 1)
        projected = spent + pace * (ends_at - last)
        parts.append(
            f'<polyline points="{point(last, spent)} {point(ends_at, projected)}" fill="none" '
            'stroke="#4a5360" stroke-width="2" stroke-dasharray="2 4"/>'
        )
    parts.append(
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - RIGHT}" y2="{TOP + plot_h}" '
        'stroke="#4a5360"/>'
    )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - every text inside is escaped above
