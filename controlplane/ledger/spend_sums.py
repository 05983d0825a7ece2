"""The spend of many budgets at once, of many organizations: the web console's lists.

`queries.spend` sums each filter apart (a `sumIf` each), which suits a key's few budgets on
the bundles' path; its cost grows with the number of filters, by a pass over the daily sums
each. Here filters alike (the same window and the same scope columns named) make one group:
one grouped pass each over the rows they may count, their scopes looked up as a set. Budgets
come in few kinds (a window and a scope kind), so the read's cost grows with the rows read,
not with the number of budgets. The sums are the same integers `queries.spend` gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from controlplane.ledger.queries import (
    DAILY_TABLE,
    SCOPE_COLUMNS,
    SINCE,
    TIME,
    Query,
    SpendFilter,
    _day,
)


@dataclass(frozen=True, slots=True)
class GroupedSpend:
    query: Query
    keys: list[tuple[int, tuple[str, ...]]]
    """Each filter's (group, organization and scope values), as the query's rows name them."""

    def nanos(self, rows: Sequence[Sequence[Any]]) -> tuple[int, ...]:
        """Each filter's spend, in the filters' order, from the query's (group, key, sum) rows;
        a scope with no spend has no row."""
        found = {(int(group), tuple(key)): int(spent or 0) for group, key, spent in rows}
        return tuple(found.get(k, 0) for k in self.keys)


def spend_grouped(
    filters: Sequence[tuple[str, SpendFilter]], since: datetime | None = None
) -> GroupedSpend:
    """Nano-USD spent under each (organization, filter): the sums of `queries.spend`, read in
    one grouped pass per kind of filter. A window that does not start or end at midnight is
    refused, as there."""
    if not filters:
        raise ValueError("spend_grouped needs at least one filter")
    organizations = sorted({organization_id for organization_id, _ in filters})
    parameters: dict[str, Any] = {"orgs": organizations}
    kinds: dict[tuple[Any, ...], int] = {}
    members: list[set[tuple[str, ...]]] = []
    keys = []
    for organization_id, wanted in filters:
        columns = tuple(c for c in SCOPE_COLUMNS if getattr(wanted, c) is not None)
        kind = (
            None if wanted.start is None else _day(wanted.start),
            None if wanted.end is None else _day(wanted.end),
            columns,
        )
        group = kinds.setdefault(kind, len(kinds))
        if group == len(members):
            members.append(set())
        key = (organization_id, *(getattr(wanted, c) for c in columns))
        members[group].add(key)
        keys.append((group, key))
    parts = []
    for (start, end, columns), group in kinds.items():
        named = ("organization_id", *columns)
        conditions = []
        if start is not None:
            parameters[f"s{group}"] = start
            conditions.append(f"day >= {{s{group}:Date}}")
        if end is not None:
            parameters[f"e{group}"] = end
            conditions.append(f"day < {{e{group}:Date}}")
        parameters[f"k{group}"] = sorted(members[group])
        if columns:
            conditions.append(
                f"({', '.join(named)}) IN "
                f"{{k{group}:Array(Tuple({', '.join('String' for _ in named)}))}}"
            )
        else:
            # One-column keys come back as 1-tuples; bound as plain strings.
            parameters[f"k{group}"] = [k[0] for k in parameters[f"k{group}"]]
            conditions.append(f"organization_id IN {{k{group}:Array(String)}}")
        parts.append(
            f"SELECT toUInt32({group}) AS kind, [{', '.join(named)}] AS scope, "  # noqa: S608
            f"sum(cost_nano_usd) AS spent FROM spent WHERE {' AND '.join(conditions)} "
            f"GROUP BY {', '.join(named)}"
        )
    daily = "organization_id IN {orgs:Array(String)}"
    rows = daily
    starts = [f.start for _, f in filters]
    earliest = None
    if all(s is not None for s in starts):
        earliest = min(s for s in starts if s is not None)
        parameters["lo"], parameters["lo_at"] = _day(earliest), earliest
        daily += " AND day >= {lo:Date}"
        rows += f" AND at >= {{lo_at:{TIME}}}"
    source = (
        f"SELECT organization_id, cost_nano_usd, {', '.join(SCOPE_COLUMNS)}, day "  # noqa: S608
        f"FROM {DAILY_TABLE} WHERE {daily}"
    )
    # As in `queries.spend_across`: the ledger's own rows ingested before the daily sums began,
    # unless every window starts a day after they did.
    if since is None or earliest is None or earliest < since + timedelta(days=1):
        rows += f" AND at < {SINCE} + toIntervalDay(1) AND ingested_at < {SINCE}"
        scopes = ", ".join(f"ifNull({c}, '') AS {c}" for c in SCOPE_COLUMNS)
        source += (
            f" UNION ALL SELECT organization_id, cost_nano_usd, {scopes}, "  # noqa: S608
            f"toDate(at, 'UTC') AS day FROM ledger_rows FINAL WHERE {rows}"
        )
    sql = f"WITH spent AS ({source}) {' UNION ALL '.join(parts)}"
    return GroupedSpend(Query(sql, parameters), keys)
