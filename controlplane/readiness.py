"""Readiness: whether this control plane can serve (its database answers and it is not
draining), and how its spend ledger is doing.

The ledger is reported, not required: proxies keep spend in their spools while it is away,
and a ledger outage must not take key resolution and the change feed (which need only the
database) out of every load balancer with it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import text

from controlplane.db import Database
from controlplane.ledger.client import LedgerError
from controlplane.ledger.store import Ledger
from vkgate.logs import event

log = logging.getLogger("vkgate.controlplane")

CHECK_TIMEOUT_S = 2.0
"""Per store: well inside the usual probe timeouts, so a hung store is reported as such."""
OK = "ok"
Status = Literal["ok", "degraded", "unavailable", "draining"]


@dataclass(frozen=True, slots=True)
class Readiness:
    status: Status
    database: str
    """`ok`, or a short reason: `timeout`, `unavailable (<error class>)`. Never a URL."""
    ledger: str

    @property
    def ready(self) -> bool:
        return self.status in ("ok", "degraded")


class ReadinessProbe:
    """Checks the database and the ledger side by side; logs only when readiness changes."""

    def __init__(self, *, db: Database, ledger: Ledger, draining: Callable[[], bool]) -> None:
        self._db = db
        self._ledger = ledger
        self._draining = draining
        self._last: Status = "ok"

    async def check(self) -> Readiness:
        database, ledger = await asyncio.gather(
            _reason(self._select_one), _reason(self._ledger.ping)
        )
        status: Status = "unavailable" if database != OK else "ok" if ledger == OK else "degraded"
        if self._draining():
            status = "draining"
        if status != self._last:
            self._last = status
            # A probe every few seconds must not mean a log line every few seconds.
            event(
                log,
                "readiness_changed",
                level=logging.INFO if status == "ok" else logging.WARNING,
                # Not `status`: in logs that is an HTTP status, a number.
                reason=f"{status}: database {database}, ledger {ledger}",
            )
        return Readiness(status=status, database=database, ledger=ledger)

    async def _select_one(self) -> None:
        async with self._db.transaction() as session:
            await session.execute(text("SELECT 1"))


async def _reason(check: Callable[[], Awaitable[None]]) -> str:
    try:
        await asyncio.wait_for(check(), CHECK_TIMEOUT_S)
    except TimeoutError:
        return "timeout"
    except LedgerError as exc:
        # The message names the ledger's host; the cause is only the kind of failure.
        return exc.cause if exc.cause == "closed" else f"unavailable ({exc.cause})"
    except Exception as exc:  # any failure to reach a store means not ready
        return f"unavailable ({type(exc).__name__})"
    return OK
