"""`RedisLeaseStore`: where replicas take their slices of each bucket, one bucket per sync.

Every sync is one Lua script on the keys of one bucket, and those keys share one hash tag (the
bucket's name in braces), so a sync touches one hash slot: it runs alike on a single Redis, a
Sentinel-managed one, and Redis Cluster, where buckets spread over every master. Syncs sent
together run in one script call per node, each as its own script would (`run`).

A replica holds at most one lease per bucket, named by its lease id, and every call on it is a
*sync*: the replica reports what it spent since the last one, says how much of its unused slice
it keeps, and may ask for more (`need`, checked against what is left; `want`, the most it would
take). What it is given beyond `need` shrinks as the bucket empties: at most a `SHARE`-th of
what is left (divided again among the replicas holding leases: `proxy.limits._lease_lua`), so far from the limit a slice
lasts many requests and near it a slice is one request, every request a sync, exactly as
exact as a call per request. A lease lives `ttl` seconds from its last sync; a replica that
stops syncing (it died) has its unused slice given back by the next call that finds it lapsed.

Layout (P is the prefix):

- token bucket `P tl:{key}`: hash `level`, `ts` (the bucket's level outside the leases, and when
  it was last refilled), and per lease `l:<id>` = "<unused> <deadline>". The level never refills
  above the capacity less the leases' unused slices, so the bucket with its leases never holds
  more than its capacity (a burst admits at most the limit across the fleet).
- slots `P sll:{key}`: hash, per lease `l:<id>` = "<slots> <deadline>".
- budget `P bg:{key}` with its `:dl` and `:ak` sorted sets (`proxy.limits._budget_lua`), where
  a lease is an open reservation `o:<id>` and each report of settled spend an unacknowledged
  entry `u:<entry>`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis.exceptions import NoScriptError, ResponseError

from proxy.limits._budget_lua import LEDGERED
from proxy.limits._lease_lua import (
    BATCH,
    BATCH_CLUSTER,
    BUDGET_SCRIPT,
    SCRIPTS,
    SLOTS_SCRIPT,
    TOKENS_SCRIPT,
)
from proxy.limits.store import Bucket, BudgetBucket, Slots

log = logging.getLogger("vkgate.proxy.limits")

__all__ = ["BUDGET_SCRIPT", "Call", "Grant", "LeaseStore", "RedisLeaseStore"]


@dataclass(slots=True)
class Grant:
    """What a sync did."""

    granted: float
    """Given beyond what the lease kept: at least `need`; 0 when nothing was asked; -1 when
    `need` could not be given (the lease kept what it had, nothing more)."""
    amount: float
    """The lease's slice in the store after the call: unused tokens, slots, or budget nanos
    (its reservations in flight included)."""
    level: float
    """Tokens: the bucket's level outside every lease. Budgets: the bucket's level, this
    lease's whole slice included. Slots: the slots every lease holds."""
    lapsed: bool
    """The lease had lapsed in the store before this call (the replica did not sync in time)."""


@dataclass(slots=True, frozen=True)
class Call:
    """One sync ready to send: a script on the keys of one bucket (one hash slot)."""

    script: int
    keys: tuple[str, ...]
    args: tuple[object, ...]


class LeaseStore(Protocol):
    """Where leases are taken, synced and given back; each call atomic on its one bucket.

    `tokens`, `slots` and `budget` only describe a sync; `run` sends many at once, one round
    trip to each node they reach, and answers each with its grant or its own error."""

    def tokens(
        self,
        bucket: Bucket,
        lease: str,
        now: float,
        *,
        used: float,
        keep: float,
        need: float,
        want: float,
        ttl: float,
        pay: float = 0.0,
    ) -> Call:
        """Lapse other leases past their deadline (their unused slices back into the level),
        refill the level, take `used` from this lease (beyond its slice: from the level),
        give back its unused slice beyond `keep`, then, when `need` > 0, take `need` (up to
        `want`) from the level if it holds `need`, `pay` of it spent at once rather than
        added to the slice (a request's cost paid by the call that takes it). The lease lives
        until `now + ttl`."""

    def slots(
        self,
        slots: Slots,
        lease: str,
        now: float,
        *,
        must: int,
        keep: int,
        need: int,
        want: int,
        ttl: int | float,
    ) -> Call:
        """Hold `must` slots (requests in flight: not checked), `keep` more (checked only when
        the lease had lapsed), and `need` (up to `want`) more if the limit leaves room."""

    def budget(
        self,
        bucket: BudgetBucket,
        lease: str,
        now: float,
        *,
        had: bool,
        must: int,
        keep: int,
        need: int,
        want: int,
        ttl: float,
        entry: str,
        settled: int,
        hold_s: float,
        acked: bool,
    ) -> Call:
        """Record `settled` nanos of spend as the unacknowledged entry `entry` (held `hold_s`;
        with `acked`, the ledger has it already: as acknowledged at `now`),
        then set this lease's open reservation to `must` (reservations in flight: not checked)
        + `keep` (checked only when the lease had lapsed) + `need` (up to `want`; a blocking
        budget gives it only if `level + need <= limit`). A newer ledger figure in `bucket`
        becomes the base, as in `Counters.reserve`."""

    async def run(self, calls: Sequence[Call]) -> list[Grant | Exception]:
        """Send `calls` together: each answered by its grant, or by the error Redis gave it.
        Raises when the store could not be reached (then none is known to have run)."""

    async def ledgered(self, key: str, entries: Sequence[str], now: float) -> None:
        """Entries of bucket `key` whose spend the ledger acknowledged at `now`."""

    async def ping(self) -> None:
        """A round trip; raises when the store cannot be reached."""

    async def close(self) -> None: ...


class RedisLeaseStore:
    """`LeaseStore` on Redis: a single server (or one Sentinel names) or a Redis Cluster
    client alike, every sync on one hash slot. Many syncs go out as one script call (on
    Cluster, one per master: a script may span the slots of its master since Redis 7), each
    sync in it as its own script would run it. Owns `client`: `close` closes it."""

    def __init__(self, client: Any, prefix: str = "vkgate:") -> None:
        self._client = client
        self._tokens_prefix = f"{prefix}tl:{{"
        self._slots_prefix = f"{prefix}sll:{{"
        self._budget_prefix = f"{prefix}bg:{{"
        self._scripts = [client.register_script(script) for script in SCRIPTS]
        self._cluster = hasattr(client, "get_node_from_key")
        self._batch_script = client.register_script(BATCH_CLUSTER if self._cluster else BATCH)
        self._batching = True
        self._ledgered = client.register_script(LEDGERED)

    def tokens(
        self,
        bucket: Bucket,
        lease: str,
        now: float,
        *,
        used: float,
        keep: float,
        need: float,
        want: float,
        ttl: float,
        pay: float = 0.0,
    ) -> Call:
        return Call(
            TOKENS_SCRIPT,
            (self._tokens_prefix + bucket.key + "}",),
            (now, lease, bucket.capacity, bucket.per_second, used, keep, need, want, ttl, pay),
        )

    def slots(
        self,
        slots: Slots,
        lease: str,
        now: float,
        *,
        must: int,
        keep: int,
        need: int,
        want: int,
        ttl: int | float,
    ) -> Call:
        return Call(
            SLOTS_SCRIPT,
            (self._slots_prefix + slots.key + "}",),
            (now, lease, slots.limit, must, keep, need, want, ttl),
        )

    def budget(
        self,
        bucket: BudgetBucket,
        lease: str,
        now: float,
        *,
        had: bool,
        must: int,
        keep: int,
        need: int,
        want: int,
        ttl: float,
        entry: str,
        settled: int,
        hold_s: float,
        acked: bool,
    ) -> Call:
        hash_key = self._budget_prefix + bucket.key + "}"
        return Call(
            BUDGET_SCRIPT,
            (hash_key, hash_key + ":dl", hash_key + ":ak"),
            (
                now,
                lease,
                bucket.ledger_nanos,
                bucket.ledger_as_of,
                "" if bucket.expires_at is None else bucket.expires_at,
                bucket.limit_nanos,
                1 if bucket.blocking else 0,
                1 if had else 0,
                must,
                keep,
                need,
                want,
                ttl,
                entry,
                settled,
                hold_s,
                1 if acked else 0,
            ),
        )

    async def run(self, calls: Sequence[Call]) -> list[Grant | Exception]:
        if len(calls) == 1:
            return [await self._one(calls[0])]
        if not self._cluster:
            return await self._batch(calls, None)
        # One call per master: its syncs' keys lie in many slots, all of them its own.
        await self._client.initialize()  # the slots' map, read once (then at once)
        nodes: dict[str, tuple[Any, list[int]]] = {}
        for i, call in enumerate(calls):
            node = self._client.get_node_from_key(call.keys[0])
            nodes.setdefault(node.name, (node, []))[1].append(i)
        answers: list[Grant | Exception] = [_UNSENT] * len(calls)
        groups = list(nodes.values())
        sent = await asyncio.gather(
            *(self._batch([calls[i] for i in at], node) for node, at in groups)
        )
        for (_, at), got in zip(groups, sent, strict=True):
            for i, answer in zip(at, got, strict=True):
                answers[i] = answer
        return answers

    async def _one(self, call: Call) -> Grant | Exception:
        # One sync needs no batch; the script object loads itself where it is missing.
        try:
            reply = await self._scripts[call.script](keys=call.keys, args=call.args)
        except ResponseError as exc:
            return exc
        return _grant(reply)

    async def _batch(self, calls: Sequence[Call], node: Any) -> list[Grant | Exception]:
        """The syncs of one node in one script; one at a time where that fails (the Redis
        before 7 without cross-slot scripts, a slot moving between masters)."""
        if len(calls) == 1:
            return [await self._one(calls[0])]
        if not self._batching:
            return await self._each(calls)
        args: list[object] = []
        for call in calls:
            args.extend((call.script, len(call.keys), len(call.args)))
            args.extend(call.keys)
            args.extend(call.args)
        options = {} if node is None else {"target_nodes": node}
        try:
            try:
                replies = await self._client.execute_command(
                    "EVALSHA", self._batch_script.sha, 0, *args, **options
                )
            except NoScriptError:
                # A server that restarted (or a master that took over) has no scripts yet.
                self._batch_script.sha = await self._client.script_load(self._batch_script.script)
                replies = await self._client.execute_command(
                    "EVALSHA", self._batch_script.sha, 0, *args, **options
                )
        except ResponseError as exc:
            if isinstance(exc, NoScriptError):
                raise
            # A Redis before 7 refuses the script's flags: syncs go one by one from now on.
            log.warning("limit syncs are sent one by one: %s", exc)
            self._batching = False
            return await self._each(calls)
        answers = [_answer(reply) for reply in replies]
        failed = [i for i, answer in enumerate(answers) if isinstance(answer, Exception)]
        if failed and node is not None:
            # A sync whose slot moved to another master meanwhile: sent on its own, the
            # client follows the move (and learns the new map).
            again = await self._each([calls[i] for i in failed])
            for i, answer in zip(failed, again, strict=True):
                answers[i] = answer
        return answers

    async def _each(self, calls: Sequence[Call]) -> list[Grant | Exception]:
        return list(await asyncio.gather(*(self._one(call) for call in calls)))

    async def ledgered(self, key: str, entries: Sequence[str], now: float) -> None:
        if not entries:
            return
        hash_key = self._budget_prefix + key + "}"
        await self._ledgered(
            keys=[hash_key, hash_key + ":dl", hash_key + ":ak"], args=[now, len(entries), *entries]
        )

    async def ping(self) -> None:
        await self._client.ping()

    async def close(self) -> None:
        await self._client.aclose()


def _answer(reply: list[Any]) -> Grant | Exception:
    if reply and reply[0] in (b"!", "!"):
        message = reply[1]
        return ResponseError(message.decode() if isinstance(message, bytes) else message)
    return _grant(reply)


_UNSENT = ResponseError("not sent")


def _grant(reply: list[Any]) -> Grant:
    return Grant(float(reply[0]), float(reply[1]), float(reply[2]), int(reply[3]) == 1)
