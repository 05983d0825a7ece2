"""The spool's drainer: seals segments on time and ships them to the ledger, oldest first.

Every `interval_s` (`VKGATE_SPEND_FLUSH_INTERVAL_SECONDS`) it seals the open segment if it
holds records. A segment that fills up is sealed at once, alone, and the next seal of the open
segment comes an interval after that. It ships sealed segments one at a time, oldest first,
each as one `SpendSegment` body, and deletes a segment only once the control plane has
acknowledged it. A crash between the ack and the delete ships the same file again
under the same `segment_id`; the ledger counts it as duplicates.

A failed shipment (network, 5xx, a bad answer) keeps the segment and waits 1 s, doubling to
60 s, before the next try; a success resets the wait. Sealing goes on meanwhile. A segment the
control plane refuses as malformed (`Refused`: 400, 413, 422) would be refused forever, so it is
set aside in the replica's `rejected/` directory instead of blocking the ones behind it. A
segment in which no line passes its checksum is set aside the same way, never shipped.

Time comes from the injected `Clock` (`monotonic`) and waits from the injected `sleep`, so a test
drives the drainer through hours of back-off without sleeping. Shutdown (`stop`) seals, then
ships for as long as the grace allows, stopping at the first failure; what is left stays on disk
for the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from proxy.control import Refused
from proxy.spend.spool import LoadedSegment, Segment, SpendSpool
from vkgate.clock import Clock, Sleep
from vkgate.logs import event
from vkgate.spend import SpendAck

log = logging.getLogger("vkgate.proxy.spend")

Ship = Callable[[bytes], Awaitable[SpendAck]]

BACKOFF_INITIAL_S = 1.0
BACKOFF_MAX_S = 60.0
ORPHAN_SCAN_INTERVAL_S = 60.0
"""How often an idle drainer looks for replica directories no process holds. The first look
comes one interval after start-up, when sibling workers have taken their own directories."""


class SpoolDrainer:
    """Seals and ships one `SpendSpool`; `start` runs it as a task, `stop` ends it.

    It sets the spool's `on_rotate` to its `wake`, so a segment that fills up is sealed and
    shipped at once rather than at the next pass.
    """

    def __init__(
        self,
        spool: SpendSpool,
        ship: Ship,
        clock: Clock,
        *,
        interval_s: float = 1.0,
        backoff_initial_s: float = BACKOFF_INITIAL_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        orphan_scan_interval_s: float = ORPHAN_SCAN_INTERVAL_S,
        sleep: Sleep | None = None,
    ) -> None:
        self._spool = spool
        self._ship = ship
        self._clock = clock
        self._interval = interval_s
        self._backoff_initial = backoff_initial_s
        self._backoff_max = backoff_max_s
        self._backoff = backoff_initial_s
        self._orphan_interval = orphan_scan_interval_s
        self._sleep = sleep or self._sleep_unless_woken
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        now = clock.monotonic()
        self._next_seal = now + interval_s
        self._next_ship = now
        self._next_orphan_scan = now + orphan_scan_interval_s
        self.failures = 0
        """Failed shipments in a row (0 after a success)."""
        spool.on_rotate = self.wake

    @property
    def retry_in_s(self) -> float:
        """How long until the next shipment may be tried (0 when not backing off)."""
        return max(0.0, self._next_ship - self._clock.monotonic())

    def wake(self) -> None:
        """Cut the current wait short (a segment filled up, or shutdown)."""
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="spend-drainer")

    async def run(self) -> None:
        while not self._stopping:
            try:
                delay = await self.step()
            except Exception:
                # A bug, or a disk that fails: logged, and tried again after a pause.
                log.exception("spend drainer pass failed")
                delay = self._interval
            if self._stopping:
                break
            await self._sleep(delay)

    async def step(self) -> float:
        """One pass: seal if due, ship if not backing off; the seconds until the next is due."""
        now = self._clock.monotonic()
        self._spool.retry_writable()
        await self._seal_if_due()
        if now >= self._next_ship:
            if await self.ship_ready():
                self._next_ship = now
            else:
                self._next_ship = self._clock.monotonic() + self._backoff
                self._backoff = min(self._backoff * 2, self._backoff_max)
        if now >= self._next_orphan_scan and self._spool.next_segment() is None:
            self._next_orphan_scan = now + self._orphan_interval
            await self._spool.adopt_orphans_async()
            if self._spool.next_segment() is not None:
                self._next_ship = now
        due = self._next_seal
        if self._spool.next_segment() is not None:
            due = min(due, self._next_ship)
        return max(0.0, due - self._clock.monotonic())

    async def ship_ready(self) -> bool:
        """Ship sealed segments oldest first until none is left (True) or one fails (False)."""
        while True:
            # A backlog takes many round trips: what is written meanwhile is still sealed on time.
            await self._seal_if_due()
            segment = self._spool.next_segment()
            if segment is None:
                return True
            if not await self._ship_one(segment):
                return False

    async def _ship_one(self, segment: Segment) -> bool:
        segment.in_flight = True
        try:
            try:
                loaded = await SpendSpool.load_async(segment)
            except FileNotFoundError:
                self._spool.reject(segment, None, "its file vanished before it was shipped")
                return True
            except OSError as exc:
                self._failed(segment, f"cannot read it: {exc}")
                return False
            if loaded.records == 0:
                self._spool.reject(segment, loaded, "no line passed its checksum")
                return True
            try:
                ack = await self._ship(loaded.body)
            except Refused as exc:
                self._spool.reject(segment, loaded, f"control plane refused it: {exc.message}")
                return True
            except Exception as exc:
                self._failed(segment, f"{type(exc).__name__}: {exc}")
                return False
            if ack.segment_id != segment.segment_id:
                self._failed(segment, f"the answer acknowledged segment {ack.segment_id!r}")
                return False
            self._acknowledged(segment, loaded, ack)
            return True
        finally:
            segment.in_flight = False

    def _acknowledged(self, segment: Segment, loaded: LoadedSegment, ack: SpendAck) -> None:
        if ack.accepted + ack.duplicates != loaded.records:
            log.warning(
                "spend segment %s/%s: shipped %d records, the ledger took %d and knew %d",
                segment.replica_id,
                segment.segment_id,
                loaded.records,
                ack.accepted,
                ack.duplicates,
            )
        self._spool.acknowledge(segment, loaded)
        event(
            log,
            "spool_shipped",
            segment=segment.segment_id,
            records=loaded.records,
            ingested=ack.accepted,
            duplicates=ack.duplicates,
        )
        self.failures = 0
        self._backoff = self._backoff_initial

    def _failed(self, segment: Segment, reason: str) -> None:
        self.failures += 1
        then = "at the next start" if self._stopping else f"in {self._backoff:.0f} s"
        log.warning(
            "cannot ship spend segment %s/%s (%s); %d segment(s) wait, next try %s",
            segment.replica_id,
            segment.segment_id,
            reason,
            len(self._spool.pending_segments()),
            then,
        )

    async def _seal_if_due(self) -> None:
        now = self._clock.monotonic()
        if now >= self._next_seal:
            self._next_seal = now + self._interval
            await self._seal()
        elif self._spool.has_rotated:
            # A segment filled up: it is sealed alone. The segment after it began when it
            # filled, so it gets an interval of its own instead of being cut after a few
            # records (a busy proxy shipped a near-empty segment after every full one, and
            # a segment costs the ledger about as much in statements as its records do).
            self._next_seal = now + self._interval
            await self._seal(open_segment=False)

    async def _seal(self, *, open_segment: bool = True) -> None:
        try:
            await self._spool.seal_async(open_segment=open_segment)
        except OSError as exc:
            log.error("cannot seal the spend spool's segments: %s", exc)

    async def stop(self, grace_s: float) -> None:
        """Stop draining: seal, ship what can be shipped within `grace_s`, leave the rest."""
        self._stopping = True
        self.wake()
        try:
            async with asyncio.timeout(grace_s):
                if self._task is not None:
                    await self._task
                await self._seal()
                await self.ship_ready()
        except TimeoutError:
            pass
        finally:
            if self._task is not None and not self._task.done():
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        left = self._spool.pending_segments()
        if left:
            log.warning(
                "spend drainer stopped with %d segment(s) not shipped; they stay in %s",
                len(left),
                self._spool.directory,
            )

    async def _sleep_unless_woken(self, seconds: float) -> None:
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._wake.wait()
        self._wake.clear()
