"""Byte streams cut at arbitrary places: what a reader of a network stream must cope with."""

from __future__ import annotations

from hypothesis import strategies as st


def cuts(stream: bytes, most: int = 30) -> st.SearchStrategy[list[bytes]]:
    """`stream` cut at up to `most` places anywhere, the pieces in order."""
    points = st.lists(st.integers(0, len(stream)), max_size=most).map(sorted)
    return points.map(
        lambda at: [stream[a:b] for a, b in zip([0, *at], [*at, len(stream)], strict=True)]
    )
