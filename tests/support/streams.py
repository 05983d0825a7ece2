"""Byte streams cut at arbitrary places: what a reader of a network stream must cope with."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st


def cuts(
    stream: bytes, most: int = 30, favour: Sequence[Sequence[int]] = ()
) -> st.SearchStrategy[list[bytes]]:
    """`stream` cut at up to `most` places anywhere, the pieces in order.

    Each group of offsets in `favour` is drawn as often as the whole stream: a uniform draw
    seldom lands inside a CRLF or a UTF-8 character, where a reader most easily slips.
    """
    groups = [st.sampled_from(sorted(set(group))) for group in favour if group]
    point = st.one_of(*groups, st.integers(0, len(stream)))
    points = st.lists(point, max_size=most).map(sorted)
    return points.map(
        lambda at: [stream[a:b] for a, b in zip([0, *at], [*at, len(stream)], strict=True)]
    )
