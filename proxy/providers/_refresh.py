"""A credential kept fresh by a blocking loader that runs in a thread, never on the event loop.

botocore and google-auth fetch credentials with blocking I/O (an STS call, an OAuth token
grant, a metadata server). A request must never wait on that in the loop: the loader runs in
the default executor, one load at a time per credential, and requests are served from what the
last load gave. A load is awaited only when there is nothing usable yet (the first request, or
a credential idle past its usable life); otherwise a request that finds the credential due for
a check starts a load in the background and goes on with the one it has.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from proxy.providers.base import ProviderUnreachable
from vkgate.clock import Clock
from vkgate.logs import event

log = logging.getLogger("vkgate.proxy.providers")

T = TypeVar("T")

FAILED_RETRY_S = 5.0
"""After a failed load, how long before one is tried again: requests go on with the old
credential meanwhile, or, with none, are refused at once. A failing token endpoint (or a
workload with no credentials, whose chain takes seconds to say so) is not asked once per
request, nor does each request wait for it."""


@dataclass(frozen=True, slots=True)
class Loaded(Generic[T]):
    value: T
    lifetime_s: float | None
    """Seconds the value is good for from when it was loaded: `math.inf` for a credential that
    never expires (stored keys), None when the loader cannot tell (the loader then keeps it
    fresh itself, and is asked again every `recheck_s`)."""


@dataclass(frozen=True, slots=True)
class Freshness:
    """When a credential is checked again, and when it may no longer be used unchecked."""

    recheck_s: float = 60.0
    """With no known lifetime: check again (in the background) this long after a load."""
    max_age_s: float = 300.0
    """With no known lifetime: past this age, a request waits for a check before using it."""
    early_s: float = 600.0
    """With a known lifetime: start a background load this long before it ends."""
    margin_s: float = 60.0
    """With a known lifetime: closer than this to its end, a request waits for a new one."""


class Refreshing(Generic[T]):
    """One credential's current value; `get` is what a request awaits."""

    def __init__(
        self,
        load: Callable[[], Loaded[T]],
        clock: Clock,
        *,
        what: str,
        provider_id: str,
        freshness: Freshness | None = None,
        initial: Loaded[T] | None = None,
    ) -> None:
        """`what` names the credential in errors and logs ("AWS credentials"); never a value.
        `initial`: a value known at once (stored keys), used without a first load."""
        self._load = load
        self._now = clock.monotonic
        self._what = what
        self._provider_id = provider_id
        self._freshness = freshness or Freshness()
        self._value: T | None = None
        self._fresh_until = -math.inf
        self._usable_until = -math.inf
        self._loading: asyncio.Future[T] | None = None
        self._failed: tuple[float, str] | None = None
        """Until when a failed load is not tried again, and what it said."""
        if initial is not None:
            self._keep(initial)

    async def get(self) -> T:
        value = self._value
        if value is not None:
            now = self._now()
            if now < self._fresh_until:
                return value
            if now < self._usable_until:
                self._start_load(background=True)
                return value
        failed = self._failed
        if failed is not None and self._now() < failed[0]:
            raise ProviderUnreachable(failed[1])
        return await asyncio.shield(self._start_load(background=False))

    def _start_load(self, *, background: bool) -> asyncio.Future[T]:
        loading = self._loading
        if loading is None:
            loading = self._loading = asyncio.ensure_future(self._run(background))
            # A request that gave up waiting leaves the load running: its failure is still
            # retrieved, so none is reported as "never retrieved".
            loading.add_done_callback(_retrieved)
        return loading

    async def _run(self, background: bool) -> T:
        try:
            loaded = await asyncio.to_thread(self._load)
        except Exception as exc:
            # The library's exception may carry a request or an answer: only its type is told.
            event(
                log,
                "provider_credentials_failed",
                logging.WARNING,
                provider_id=self._provider_id,
                cause=type(exc).__name__,
            )
            if background and self._value is not None:
                self._fresh_until = min(self._now() + FAILED_RETRY_S, self._usable_until)
                return self._value
            message = f"no {self._what} could be had ({type(exc).__name__})"
            self._failed = (self._now() + FAILED_RETRY_S, message)
            raise ProviderUnreachable(message) from None
        finally:
            self._loading = None
        self._failed = None
        self._keep(loaded)
        return loaded.value

    def _keep(self, loaded: Loaded[T]) -> None:
        now, fresh = self._now(), self._freshness
        lifetime = loaded.lifetime_s
        if lifetime is None:
            self._fresh_until = now + fresh.recheck_s
            self._usable_until = now + fresh.max_age_s
        else:
            self._fresh_until = now + max(lifetime - fresh.early_s, 0.0)
            self._usable_until = now + max(lifetime - fresh.margin_s, 0.0)
        self._value = loaded.value


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
