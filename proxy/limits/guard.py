"""One request's rate limits and budgets: admitted in one call to the counters, finished in one.

Before the provider is paid, `admit` takes from the key's (and team's) token buckets, holds its
concurrency slots and reserves its worst-case cost against its budgets, all or nothing, in one
atomic call (one Redis round trip with shared counters). After the answer, `finish` corrects
the token buckets to the tokens used, frees the slots and settles the budgets to the actual cost,
in one more.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass

from proxy.errors import ProxyError
from proxy.limits.budgets import HOLD_S, BudgetAsk, BudgetGuard, BudgetRule, Worst
from proxy.limits.rates import Headers, RatePlan
from proxy.limits.store import Admission, Bucket, BudgetBucket, Counters, Slots
from proxy.providers import Upstream
from vkgate.clock import Clock
from vkgate.spend import SpendRecord

WARNING_HEADER = b"x-vkgate-budget-warning"
_NO_BUDGETS: tuple[BudgetBucket, ...] = ()
_NO_AMOUNTS: tuple[int, ...] = ()


@dataclass(slots=True)
class Hold:
    """What an admitted request holds until `finish`."""

    holder: str
    """The id it holds under: unique per request, never the client's X-Request-ID."""
    plan: RatePlan | None
    estimate: int
    """Tokens taken from the token buckets."""
    ask: BudgetAsk | None
    chain: tuple[Upstream, ...]
    """The chain left to walk (providers whose filtered budgets are out removed)."""
    headers: Headers
    """Rate-limit state and budget warnings, for every answer to this request."""


class Governor:
    def __init__(self, counters: Counters, budgets: BudgetGuard, clock: Clock, lease_s: float):
        """`lease_s`: how long one provider call may take; a reservation is leased for that
        times the chain's length."""
        self._counters = counters
        self.budgets = budgets
        self._clock = clock
        self._lease_s = lease_s

    async def admit(
        self,
        holder: str,
        plan: RatePlan | None,
        rules: Sequence[BudgetRule],
        estimate: int,
        worst: Worst,
        chain: tuple[Upstream, ...],
        end_user: str | None,
    ) -> Hold:
        """Admit the request (`estimate`: its prompt's tokens for the token buckets; `worst`:
        its most tokens, for budgets) or raise its refusal (`429 rate_limited`, `402 budget_exceeded`,
        `400 end_user_required`). With an empty chain (the model was refused) only the rate
        limits are taken: the caller raises its own refusal after."""
        tokens = estimate + (worst.output_tokens or 0)
        # One reading of the clock for the whole admission: the budgets' windows and the
        # counters see the same moment.
        now = self._clock.time()
        ask = (
            await self.budgets.ask_at(rules, chain, end_user, worst, now)
            if rules and chain
            else None
        )
        admission = await self._admission(holder, plan, tokens, ask, chain, now)
        if (
            ask is not None
            and admission.reservation is not None
            and admission.reservation.refused is not None
            and (retry := self.budgets.retry_without_groups(ask, admission.reservation, chain))
        ):
            # Every provider with a filtered budget is out; the rest of the chain may serve.
            ask, chain = retry
            admission = await self._admission(holder, plan, tokens, ask, chain, now)
        levels = admission.levels
        headers = plan.headers(levels) if plan is not None else ()
        if plan is not None and levels is not None and not levels.admitted:
            raise plan.refusal(levels, tokens, headers)
        if plan is not None and admission.slots_refused is not None:
            raise plan.slots_refusal(admission.slots_refused, headers)
        hold = Hold(holder, plan, tokens, ask, chain, headers)
        if ask is None or admission.reservation is None:
            return hold
        try:
            hold.chain, warning = self.budgets.conclude(ask, admission.reservation, chain)
        except ProxyError as exc:
            # Refused: `admit` took nothing.
            exc.headers = (*exc.headers, *headers)
            raise
        except Exception:
            # Admitted, then a bug: what was taken is given back before the error goes on.
            await self.finish(hold, None, None)
            raise
        if warning is not None:
            hold.headers = (*headers, (WARNING_HEADER, warning))
        return hold

    def _admission(
        self,
        holder: str,
        plan: RatePlan | None,
        tokens: int,
        ask: BudgetAsk | None,
        chain: tuple[Upstream, ...],
        now: float,
    ) -> Awaitable[Admission]:
        """The counters' `admit` call, awaited by the caller (no coroutine of its own)."""
        if plan is None:
            buckets: Sequence[Bucket] = ()
            slots: Sequence[Slots] = ()
        else:
            buckets, slots = plan.buckets(tokens), plan.slots
        return self._counters.admit(
            holder,
            buckets,
            slots,
            ask.buckets if ask is not None else _NO_BUDGETS,
            ask.amounts if ask is not None else _NO_AMOUNTS,
            # Every credential of the chain may take its whole timeout.
            self._lease_s * (len(chain) or 1),
            now,
        )

    async def finish(self, hold: Hold, record: SpendRecord | None, served: Upstream | None) -> None:
        """Correct the token buckets, free the slots and settle the budgets, from the request's
        outcome record (its tokens) and the credential that served it (its prices)."""
        used = record.input_tokens + record.output_tokens if record is not None else 0
        plan, ask = hold.plan, hold.ask
        costs: list[int] = []
        if ask is not None:
            cost = 0
            if record is not None and served is not None and served.rates is not None:
                cost = served.rates.spent(record)
            costs = ask.costs(served.provider_id if served is not None else None, cost)
        await self._counters.finish(
            hold.holder,
            plan.corrections(hold.estimate, used) if plan is not None else (),
            plan.slots if plan is not None else (),
            ask.buckets if ask is not None else _NO_BUDGETS,
            costs,
            HOLD_S,
            self._clock.time(),
        )
        if ask is not None:
            if record is not None and not record.seq:
                # The spool holds it until its disk takes it: its seq comes then.
                self.budgets.settled_unwritten(record, ask, hold.holder, costs)
            else:
                self.budgets.settled(
                    record.seq if record is not None else None, ask, hold.holder, costs
                )
