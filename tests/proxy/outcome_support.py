"""The outcome records a test proxy wrote, read back from the ledger they were shipped to."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec

from proxy.app import Running
from tests.proxy.conftest import RunningProxy
from tests.support.api import ADMIN
from vkgate.spend import SpendRecord

_FIELDS = frozenset(SpendRecord.__struct_fields__)


async def outcomes(proxy: RunningProxy, client: httpx.AsyncClient, org: str) -> list[SpendRecord]:
    """Every `confirm` and `fail` of `org` in the order the proxy wrote them: the spool sealed
    and shipped first (as its drainer does every second), so nothing is read half-way."""
    running: Running = proxy.app.state["running"]
    assert running.spool is not None and running.drainer is not None
    await running.spool.seal_async()
    assert await running.drainer.ship_ready(), "the control plane acknowledged every segment"
    rows: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {"organization_id": org, "limit": "1000", **({"cursor": cursor} if cursor else {})}
        response = await client.get("/api/spend/ledger", params=params, headers=ADMIN)
        assert response.status_code == 200, response.text
        page = response.json()
        rows += page["data"]
        cursor = page["next_cursor"]
        if not cursor:
            break
    records = [
        # Decimals (audio seconds) come as strings; they are no part of what is checked here.
        msgspec.convert({k: v for k, v in row.items() if k in _FIELDS}, SpendRecord, strict=False)
        for row in rows
        if row["kind"] != "admit"
    ]
    return sorted(records, key=lambda r: r.seq)
