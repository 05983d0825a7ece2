"""What the ledger of a running control plane holds, read through its finance API."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import httpx

from tests.support.api import ADMIN
from tests.support.processes import POLL_INTERVAL_S, Service

LEDGER_WAIT_S = 30.0
"""Bound on waiting for a proxy's drainer to ship what it holds, once it can."""


def ledger_rows(controlplane: Service, org: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor: str | None = None
    with httpx.Client(base_url=controlplane.url, headers=ADMIN, timeout=10) as http:
        while True:
            params = {"organization_id": org, "limit": "1000"}
            if cursor:
                params["cursor"] = cursor
            response = http.get("/api/spend/ledger", params=params)
            assert response.status_code == 200, response.text
            page = response.json()
            rows += page["data"]
            cursor = page["next_cursor"]
            if not cursor:
                return rows


def outcomes_in_ledger(
    controlplane: Service, org: str, request_ids: list[str]
) -> dict[str, dict[str, Any]]:
    """Each request's outcome row (`confirm` or `fail`), once every one of them is in the
    ledger; fails if one never arrives or arrives twice."""
    deadline = time.monotonic() + LEDGER_WAIT_S
    while True:
        confirms = [r for r in ledger_rows(controlplane, org) if r["kind"] != "admit"]
        counted = Counter(r["request_id"] for r in confirms)
        missing = [r for r in request_ids if r not in counted]
        if not missing:
            doubled = [r for r in request_ids if counted[r] > 1]
            assert not doubled, f"counted twice: {doubled}"
            return {r["request_id"]: r for r in confirms}
        assert time.monotonic() < deadline, f"never landed: {missing}"
        time.sleep(POLL_INTERVAL_S * 4)  # waiting on another process's drainer, bounded above
