"""What a budget counts: its calendar window (UTC), its scope and its provider filter."""

from __future__ import annotations

from datetime import datetime

from controlplane.ledger.queries import SpendFilter
from vkgate.spend import SpendRecord
from vkgate.windows import window_bounds


def touches(
    *, scope_kind: str, scope_id: str | None, provider_id: str | None, record: SpendRecord
) -> bool:
    """Whether a budget of the record's organization counts this record."""
    if provider_id is not None and provider_id != record.provider_id:
        return False
    if scope_kind == "organization":
        return True
    if scope_kind == "end_user":
        # Without an id it is a template: one bucket per end user of the organization.
        return record.end_user is not None and scope_id in (None, record.end_user)
    column = {"team": "team_id", "project": "project_id", "virtual_key": "virtual_key_id"}
    return scope_id is not None and getattr(record, column[scope_kind]) == scope_id


def spend_filter(
    *,
    scope_kind: str,
    scope_id: str | None,
    provider_id: str | None,
    window: str,
    now: datetime,
    end_user: str | None = None,
) -> SpendFilter:
    """The ledger rows a budget counts in its current window; `end_user` picks the bucket of
    a per-end-user budget."""
    start, end = window_bounds(window, now)
    scope: dict[str, str | None] = {}
    if scope_kind == "team":
        scope["team_id"] = scope_id
    elif scope_kind == "project":
        scope["project_id"] = scope_id
    elif scope_kind == "virtual_key":
        scope["virtual_key_id"] = scope_id
    elif scope_kind == "end_user":
        scope["end_user"] = scope_id or end_user
    return SpendFilter(start=start, end=end, provider_id=provider_id, **scope)
