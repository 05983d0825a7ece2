"""Cross-replica wake-ups: PostgreSQL LISTEN/NOTIFY tells every control plane of a commit."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
from sqlalchemy.engine import make_url

from controlplane.feed.service import FeedNotifier
from vkgate.logs import event

log = logging.getLogger("vkgate.controlplane.feed")

CHANNEL = "vkgate_feed"
RECONNECT_DELAY_S = 1.0


def libpq_url(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


class PostgresFeedListener:
    """Holds one connection that LISTENs; each NOTIFY wakes this replica's waiting long-polls.

    Without it a write made through another replica would wait for the periodic re-read.
    """

    def __init__(self, database_url: str, notifier: FeedNotifier) -> None:
        self._url = libpq_url(database_url)
        self._notifier = notifier
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is not None and not self._task.done():
            # A second start would leave the first connection listening, and reconnecting,
            # after `stop`.
            raise RuntimeError("the feed listener is already started")
        self._task = asyncio.create_task(self._run(), name="feed-listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True
                ) as connection:
                    await connection.execute(f"LISTEN {CHANNEL}")
                    # Anything committed while we were away is caught by this wake-up.
                    self._notifier.notify()
                    async for _ in connection.notifies():
                        self._notifier.notify()
            except psycopg.Error as exc:
                event(
                    log,
                    "feed_listener_reconnecting",
                    level=logging.WARNING,
                    cause=type(exc).__name__,
                )
                await asyncio.sleep(RECONNECT_DELAY_S)
