"""The ledger's SQL: every read and the duplicate lookup, with server-side bound parameters.

Only constants of this module (tables, columns, expressions) are ever put into the text; every
value is a bound `{name:Type}` parameter, hence the `noqa: S608`s.

Every read of `ledger_rows` and `ledger_admits` uses FINAL, so a duplicate row that a race let
in (and that the ReplacingMergeTree has not merged away yet) is never counted twice. Budgets
read daily sums instead (`spend`), which count such a row twice, more than was spent and never
less: see migrations/clickhouse/0002_spend_daily.sql.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from controlplane.ledger.rows import LEDGER_COLUMNS, TOKEN_COLUMNS, UNIT_COLUMNS

TIME = "DateTime64(6, 'UTC')"
DAILY_TABLE = "ledger_spend_daily"
DAILY_SINCE_TABLE = "ledger_spend_daily_since"
SINCE = f"(SELECT min(since) FROM {DAILY_SINCE_TABLE})"  # noqa: S608
"""When the daily sums began: rows ingested before are read from the ledger itself."""
SCOPE_COLUMNS = ("team_id", "project_id", "virtual_key_id", "end_user", "provider_id")
"""What a budget's scope can name: '' for none in the daily sums."""

GROUPS: dict[str, tuple[str, str]] = {
    # group_by name → (output field, SQL expression)
    "team": ("team_id", "team_id"),
    "project": ("project_id", "project_id"),
    "virtual_key": ("virtual_key_id", "virtual_key_id"),
    "model": ("model", "model"),
    "served_model": ("served_model", "served_model"),
    "provider": ("provider_id", "provider_id"),
    "end_user": ("end_user", "end_user"),
    "day": ("day", "toString(toDate(at, 'UTC'))"),
    "route": ("route", "route"),
}
# Measures are aliased apart from the columns: an alias named like a column (`refused`) would
# stand for the aggregate inside the other measures too.
MEASURE_PREFIX = "m_"
MEASURES: tuple[tuple[str, str], ...] = (
    ("requests", "countIf(kind = 'confirm')"),
    ("refused", "countIf(kind = 'fail' AND refused)"),
    ("failed", "countIf(kind = 'fail' AND NOT refused)"),
    *((c, f"sum({c})") for c in TOKEN_COLUMNS),
    *((c, f"sum({c})") for c in UNIT_COLUMNS),
    ("audio_seconds", "sum(audio_seconds)"),
    # Requests that spent something no price covers: their cost is 0 in the ledger.
    ("unpriced", "countIf(price_source = 'unpriced')"),
    ("cost_nano_usd", "sum(cost_nano_usd)"),
    # Requests answered from the response cache, and what the provider calls they spared cost.
    ("cache_hits", "countIf(cache_hit)"),
    ("saved_nano_usd", "sum(saved_nano_usd)"),
)


@dataclass(frozen=True, slots=True)
class SpendFilter:
    """Ledger rows of one organization that a budget counts: its window, scope and provider."""

    start: datetime | None = None
    end: datetime | None = None
    team_id: str | None = None
    project_id: str | None = None
    virtual_key_id: str | None = None
    end_user: str | None = None
    provider_id: str | None = None


@dataclass(frozen=True, slots=True)
class Period:
    organization_id: str
    start: datetime | None = None
    """Inclusive."""
    end: datetime | None = None
    """Exclusive."""


@dataclass(frozen=True, slots=True)
class Query:
    sql: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ReplicaRange:
    """One replica's records numbered within `seqs` and timed within `times`, both inclusive."""

    replica_id: str
    seqs: tuple[int, int]
    times: tuple[datetime, datetime]


def stored_ids(
    table: str, ranges: Sequence[ReplicaRange], organizations: Sequence[str] | None = None
) -> Query:
    """Ids the table holds of the records within any of `ranges`, of `organizations` when
    given: one query for the segments of every replica written together.

    What a segment's duplicates are looked up with: a record's id, replica and number are
    fixed when its proxy writes it, so any copy the ledger holds of a segment's records is
    among these rows. Ranges, not the segment's ids: binding thousands of ids as one literal
    cost three times the query itself. The time range (and organizations) narrow the search to
    the sorting key's prefix.
    """
    if not ranges:
        raise ValueError("stored_ids needs at least one range")
    narrowing = ""
    parameters: dict[str, Any] = {
        "lo": min(r.times[0] for r in ranges),
        "hi": max(r.times[1] for r in ranges),
    }
    if organizations is not None:
        narrowing = "organization_id IN {orgs:Array(String)} AND "
        parameters["orgs"] = sorted(set(organizations))
    each = []
    for n, r in enumerate(ranges):
        each.append(
            f"(replica_id = {{replica{n}:String}} AND at >= {{lo{n}:{TIME}}} "
            f"AND at <= {{hi{n}:{TIME}}} AND seq >= {{first{n}:UInt64}} "
            f"AND seq <= {{last{n}:UInt64}})"
        )
        parameters[f"replica{n}"] = r.replica_id
        parameters[f"lo{n}"], parameters[f"hi{n}"] = r.times
        parameters[f"first{n}"], parameters[f"last{n}"] = r.seqs
    return Query(
        f"SELECT id FROM {table} WHERE {narrowing}"  # noqa: S608
        f"at >= {{lo:{TIME}}} AND at <= {{hi:{TIME}}} AND ({' OR '.join(each)})",
        parameters,
    )


def spend(
    organization_id: str, filters: Sequence[SpendFilter], since: datetime | None = None
) -> Query:
    """One sum of cost_nano_usd per filter, in one pass over the organization's daily sums.

    Budgets' windows are whole UTC days, so the daily sums (`ledger_spend_daily`) give their
    spend without reading the rows they sum. They hold what was ingested from `since` on (see
    migrations/clickhouse/0002_spend_daily.sql); what came before is read from the ledger
    itself, a part that ends a day after `since` and so stops growing. Within that day, the
    granules ingested after `since` are skipped by their `ingested_at` range (the index of
    migrations/clickhouse/0003_ingested_at_index.sql), not read and merged. When the caller
    knows `since` and every window starts a day after it or later, that part holds nothing
    the windows count and is left out of the query (it cost more than the daily sums: 4 of a
    read's 7.4 ms, every row's sums in place). A window that does not start or end at midnight
    is refused.
    """
    return spend_across([(organization_id, f) for f in filters], since)


def spend_across(
    filters: Sequence[tuple[str, SpendFilter]], since: datetime | None = None
) -> Query:
    """As `spend`, each filter of its own organization: the budgets of many organizations
    (the web console's lists) in one pass instead of a read each."""
    organizations = sorted({organization_id for organization_id, _ in filters})
    single = len(organizations) == 1
    parameters: dict[str, Any] = {"org": organizations[0]} if single else {"orgs": organizations}
    sums = []
    for i, (organization_id, wanted) in enumerate(filters):
        conditions = []
        if not single:
            parameters[f"o{i}"] = organization_id
            conditions.append(f"organization_id = {{o{i}:String}}")
        if wanted.start is not None:
            parameters[f"s{i}"] = _day(wanted.start)
            conditions.append(f"day >= {{s{i}:Date}}")
        if wanted.end is not None:
            parameters[f"e{i}"] = _day(wanted.end)
            conditions.append(f"day < {{e{i}:Date}}")
        for column in SCOPE_COLUMNS:
            value = getattr(wanted, column)
            if value is not None:
                parameters[f"{column}{i}"] = value
                conditions.append(f"{column} = {{{column}{i}:String}}")
        sums.append(f"sumIf(cost_nano_usd, {' AND '.join(conditions) or '1'})")
    daily = rows = (
        "organization_id = {org:String}" if single else "organization_id IN {orgs:Array(String)}"
    )
    starts = [f.start for _, f in filters]
    earliest = None
    if starts and all(s is not None for s in starts):
        earliest = min(s for s in starts if s is not None)
        parameters["lo"], parameters["lo_at"] = _day(earliest), earliest
        daily += " AND day >= {lo:Date}"
        rows += f" AND at >= {{lo_at:{TIME}}}"
    columns = ", ".join(SCOPE_COLUMNS)
    # One organization's read (a key's budgets, on every bundle) names no organization column.
    owner = "" if single else "organization_id, "
    daily_part = f"SELECT {owner}cost_nano_usd, {columns}, day FROM {DAILY_TABLE} "  # noqa: S608
    if since is not None and earliest is not None and earliest >= since + timedelta(days=1):
        sql = f"SELECT {', '.join(sums)} FROM ({daily_part}WHERE {daily})"  # noqa: S608
        return Query(sql, parameters)
    rows += f" AND at < {SINCE} + toIntervalDay(1) AND ingested_at < {SINCE}"
    scopes = ", ".join(f"ifNull({c}, '') AS {c}" for c in SCOPE_COLUMNS)
    sql = (
        f"SELECT {', '.join(sums)} FROM ("  # noqa: S608
        f"{daily_part}WHERE {daily} UNION ALL "
        f"SELECT {owner}cost_nano_usd, {scopes}, toDate(at, 'UTC') AS day "
        f"FROM ledger_rows FINAL WHERE {rows})"
    )
    return Query(sql, parameters)


def _day(moment: datetime) -> date:
    if moment.utcoffset() != timedelta(0) or moment.time() != time(0):
        raise ValueError(f"budget windows are whole UTC days: {moment.isoformat()} is not midnight")
    return moment.date()


def _period(period: Period) -> tuple[str, dict[str, Any]]:
    conditions = ["organization_id = {org:String}"]
    parameters: dict[str, Any] = {"org": period.organization_id}
    if period.start is not None:
        conditions.append(f"at >= {{start:{TIME}}}")
        parameters["start"] = period.start
    if period.end is not None:
        conditions.append(f"at < {{end:{TIME}}}")
        parameters["end"] = period.end
    return " AND ".join(conditions), parameters


def report(period: Period, group_by: Sequence[str], measures: Sequence[str] | None = None) -> Query:
    """Counts, token sums and cost per group; without groups, one row (none if no rows).

    Measures come back prefixed with MEASURE_PREFIX: all of MEASURES, or those named in
    `measures` (fewer columns read: the web console's table shows some).
    """
    where, parameters = _period(period)
    groups = [f"{GROUPS[g][1]} AS {GROUPS[g][0]}" for g in group_by]
    wanted = [(n, e) for n, e in MEASURES if measures is None or n in measures]
    if measures is not None and len(wanted) != len(set(measures)):
        raise ValueError(f"unknown measures: {sorted(set(measures) - {n for n, _ in wanted})}")
    selected = [f"{expression} AS {MEASURE_PREFIX}{name}" for name, expression in wanted]
    sql = f"SELECT {', '.join([*groups, *selected])} FROM ledger_rows FINAL WHERE {where}"  # noqa: S608
    if group_by:
        fields = ", ".join(GROUPS[g][0] for g in group_by)
        sql += f" GROUP BY {fields} ORDER BY {fields}"
    else:
        sql += " HAVING count() > 0"
    return Query(sql, parameters)


def rows(period: Period, after: tuple[datetime, str] | None, limit: int) -> Query:
    """Rows in (at, id) order after the cursor's row; `limit` of them."""
    where, parameters = _period(period)
    if after is not None:
        where += f" AND (at > {{after_at:{TIME}}} OR (at = {{after_at:{TIME}}} AND id > {{after_id:String}}))"
        parameters["after_at"], parameters["after_id"] = after
    return Query(
        f"SELECT {', '.join(LEDGER_COLUMNS)} FROM ledger_rows FINAL WHERE {where} "  # noqa: S608
        f"ORDER BY at, id LIMIT {int(limit)}",
        parameters,
    )


def unfinished(start: datetime, end: datetime) -> Query:
    """Admits in [start, end) whose request has no outcome row: a proxy died serving them."""
    return Query(
        "SELECT id, replica_id, seq, request_id, at, route FROM ledger_admits FINAL "  # noqa: S608
        f"WHERE at >= {{start:{TIME}}} AND at < {{end:{TIME}}} AND (replica_id, request_id) "
        f"NOT IN (SELECT replica_id, request_id FROM ledger_rows WHERE at >= {{start:{TIME}}}) "
        "ORDER BY at, id",
        {"start": start, "end": end},
    )


USAGE_SINCE = "(SELECT min(since) FROM ledger_usage_daily_since)"
"""When the overview's daily sums began: rows ingested before are read from the ledger."""
USAGE_DIMENSIONS = "[('virtual_key', ifNull(virtual_key_id, '')), ('model', ifNull(model, ''))]"


def overview(
    organizations: Sequence[str] | None,
    month_start: datetime,
    day_start: datetime,
    top_keys: int = 5,
) -> Query:
    """This month's and today's served requests, refusals, failures and cost of each
    organization by key (`dimension` virtual_key) and by model (`dimension` model), from the
    daily sums of migrations/clickhouse/0005_usage_daily.sql and, for rows ingested before
    they began, the ledger itself. Every row has one model value ('' for none), so an
    organization's totals are the sum of its model rows.

    `organizations` None reads every organization (a token bound to none)."""
    parameters: dict[str, Any] = {
        "month": month_start.date(),
        "month_at": month_start,
        "today": day_start.date(),
    }
    owners = ""
    if organizations is not None:
        owners = " AND organization_id IN {orgs:Array(String)}"
        parameters["orgs"] = sorted(set(organizations))
    measures = []
    for prefix, condition in (("month_", "1"), ("today_", "day >= {today:Date}")):
        measures += [
            f"sumIf(requests, {condition}) AS {prefix}requests",
            f"sumIf(refused, {condition}) AS {prefix}refused",
            f"sumIf(failed, {condition}) AS {prefix}failed",
            f"sumIf(cost_nano_usd, {condition}) AS {prefix}cost_nano_usd",
        ]
    # Every model row (an organization's totals are their sums) and the `top_keys` keys that
    # spent most: tens of rows to the control plane, not one per key.
    parameters["top_keys"] = top_keys
    return Query(
        "SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY dimension "  # noqa: S608
        "ORDER BY month_cost_nano_usd DESC, value) AS rank FROM ("
        f"SELECT dimension, organization_id, value, {', '.join(measures)} FROM ("
        "SELECT organization_id, day, dimension, value, requests, refused, failed, "
        "cost_nano_usd FROM ledger_usage_daily "
        f"WHERE day >= {{month:Date}}{owners} "
        "UNION ALL "
        "SELECT organization_id, toDate(at, 'UTC') AS day, pair.1 AS dimension, "
        "pair.2 AS value, toUInt64(kind = 'confirm') AS n_requests, "
        "toUInt64(kind = 'fail' AND refused) AS n_refused, "
        "toUInt64(kind = 'fail' AND NOT refused) AS n_failed, cost_nano_usd AS n_cost "
        f"FROM ledger_rows FINAL ARRAY JOIN {USAGE_DIMENSIONS} AS pair "
        f"WHERE at >= {{month_at:{TIME}}} AND at < {USAGE_SINCE} + toIntervalDay(1) "
        f"AND ingested_at < {USAGE_SINCE}{owners}"
        ") GROUP BY dimension, organization_id, value)) "
        "WHERE dimension = 'model' OR rank <= {top_keys:UInt32}",
        parameters,
    )
