"""Spending budgets, enforced at admission: reserve a request's most likely cost, settle its actual cost.

A request names the scopes it is spent in (its key, person, project, team and org). Before any
engine sees it, :meth:`Budgets.reserve` holds its reservation (its prompt and the completion it
may ask for, priced by the settings) against every scope that has a budget, and refuses it with
429 when the scope's spend plus the reservations in flight plus this one would pass the budget.
Because every admitted request's reservation is counted before the next is decided, concurrent
requests can pass a budget only by what a request spends beyond its reservation (an estimated
prompt that was longer), never by a whole burst.

A reservation is an upper bound of the request's cost (:mod:`opod.gateway.promptsize`): its
prompt's tokens, its chat template's counted by a worker, and each choice's ``max_tokens``.

Spend is kept in memory per scope and period (UTC day, ISO week from Monday, calendar month),
loaded from the store's usage rows when a budget is configured and kept up to date by every
settled request of this leader. A budget in the settings names its scope as text; the tenancy
resolves it to an id (an unknown scope is logged and governs nothing until it exists).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Protocol

from opod.fleet.followers import EventSink
from opod.http.errors import GatewayError
from opod.settings.schema import Budget, ClusterSettings, Price

log = logging.getLogger("opod.gateway")

PERIODS = ("day", "week", "month")
ADJECTIVE = {"day": "daily", "week": "weekly", "month": "monthly"}
RETRY_UNRESOLVED_S = 5.0
PRICES_KEPT = 1024
"""Models whose price is kept looked up, at most."""


class BudgetExceeded(GatewayError):
    """A scope's spend and the requests in flight have used its budget for the period: refused before any engine.

    ``insufficient_quota`` is OpenAI's type and code for spend that ran out, so clients that stop
    retrying on it do so here too; ``Retry-After`` is the seconds until the period ends.
    """

    status = 429
    type = "insufficient_quota"
    code = "insufficient_quota"

    def __init__(self, message: str, *, scope: str, period: str, retry_after_s: int) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, retry_after_s))})
        self.scope = scope
        self.period = period


class ScopeLike(Protocol):
    """A resolved scope (``opod.access.scopes.Scope``): its kind and id."""

    @property
    def kind(self) -> str: ...

    @property
    def id(self) -> str: ...


class SettingsSource(Protocol):
    """The cluster's settings in force (``opod.settings.holder.SettingsHolder``)."""

    @property
    def current(self) -> ClusterSettings: ...


Resolve = Callable[[str], ScopeLike]
"""A budget's scope text → its scope; raises (NotFound, InvalidInput) for one that does not exist."""
SpentSince = Callable[[str, str, datetime], int]
"""(kind, id, since) → the micros that scope has spent since then (the store's usage rows)."""


def period_bounds(period: str, now: datetime) -> tuple[datetime, datetime]:
    """The UTC period holding ``now``: [start, end)."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day, day + timedelta(days=1)
    if period == "week":
        start = day - timedelta(days=day.weekday())
        return start, start + timedelta(days=7)
    if period == "month":
        start = day.replace(day=1)
        end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
        return start, end
    raise ValueError(f"period {period!r} is not one of {', '.join(PERIODS)}")


@dataclass(slots=True)
class Account:
    """One budget: a scope's spend in its current period and the reservations held against it."""

    kind: str
    id: str
    text: str
    """The scope as the settings name it, for refusals and events."""
    period: str
    micros: int
    start: datetime
    end: datetime
    spent: int = 0
    reserved: int = 0
    crossed: bool = False
    """``budget.crossed`` was emitted for this period."""
    ends_at: float = field(init=False)
    """``end`` in POSIX seconds: what a request compares the time with (a float, not a ``datetime``, which costs several
    times as much to read and compare on a request that runs cold)."""

    def __post_init__(self) -> None:
        self.ends_at = self.end.timestamp()

    def roll(self, now: datetime) -> None:
        """Start the period holding ``now`` afresh."""
        self.start, self.end = period_bounds(self.period, now)
        self.ends_at = self.end.timestamp()
        self.spent, self.crossed = 0, False


class Reservation:
    """A request's hold on its scopes' budgets; :meth:`settle` it once, with what it actually cost."""

    __slots__ = ("_budgets", "_held", "micros", "settled")

    def __init__(self, budgets: Budgets | None, held: list[Account], micros: int) -> None:
        self._budgets = budgets
        self._held = held
        self.micros = micros
        self.settled = False

    def settle(self, actual_micros: int) -> None:
        """Release the hold and count ``actual_micros`` as spent in every scope it held (once; later calls do
        nothing)."""
        if self.settled:
            return
        self.settled = True
        budgets = self._budgets
        if budgets is None or not self._held:
            return
        actual = max(0, int(actual_micros))
        crossed: list[Account] = []
        now = budgets.seconds()
        with budgets._lock:
            for account in self._held:
                account.reserved = max(0, account.reserved - self.micros)
                if now >= account.ends_at:
                    account.roll(budgets.clock())
                account.spent += actual
                if account.spent >= account.micros and not account.crossed:
                    account.crossed = True
                    crossed.append(account)
        if crossed:
            budgets._emit_crossed(crossed)


NO_RESERVATION = Reservation(None, [], 0)
"""What a request without a budgeted scope holds: settling it does nothing."""


class Budgets:
    def __init__(
        self,
        *,
        settings: SettingsSource,
        resolve: Resolve | None = None,
        spent_since: SpentSince | None = None,
        emit: EventSink | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.settings = settings
        self.resolve = resolve
        self.spent_since = spent_since
        self.emit = emit
        self.clock: Callable[[], datetime] = clock or partial(datetime.now, UTC)
        """The time as periods are started and refusals say it."""
        self.seconds: Callable[[], float] = time.time if clock is None else lambda: self.clock().timestamp()
        """The same time in POSIX seconds, which every budgeted request reads (:attr:`Account.ends_at`)."""
        self._lock = threading.Lock()  # settle may run from a thread (a prompt counted later)
        self._configured_for: ClusterSettings | None = None
        self._accounts: dict[tuple[str, str], list[Account]] = {}
        """(kind, id) → its budgets (one per period)."""
        self._retry_at: float | None = None
        """When a budget naming a scope that did not exist is looked up again (a team created since)."""
        self._priced_for: ClusterSettings | None = None
        self._prices: dict[str, Price] = {}
        """model → its price under ``_priced_for`` (settings are replaced, never changed, so their identity keys it)."""

    # --- prices -------------------------------------------------------------------

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int) -> int:
        """A request's cost in micros at the settings' prices (0 where no price is set): its tokens times the price
        per million, which is micros per token."""
        # Every request is priced twice (its reservation, its end): each model's price is looked up once per settings.
        current = self.settings.current
        if current is not self._priced_for:
            self._priced_for, self._prices = current, {}
        price = self._prices.get(model)
        if price is None:
            if not current.prices:
                return 0
            if len(self._prices) >= PRICES_KEPT:  # a bound, whatever names come; a catalog's models fit in it
                self._prices = {}
            price = self._prices[model] = current.price(model)
        return round(prompt_tokens * price.input_per_million + completion_tokens * price.output_per_million)

    # --- configuration --------------------------------------------------------------

    def configure(self, settings: ClusterSettings | None = None) -> None:
        """Take the settings' budgets (the ones in force when ``None``); a budget kept keeps its spend."""
        settings = self.settings.current if settings is None else settings
        now = self.clock()
        with self._lock:
            old = {(a.kind, a.id, a.period): a for accounts in self._accounts.values() for a in accounts}
            accounts: dict[tuple[str, str], list[Account]] = {}
            unresolved = False
            for budget in settings.budgets:
                scope = self._resolve(budget)
                if scope is None:
                    unresolved = True
                    continue
                start, end = period_bounds(budget.period, now)
                kept = old.get((scope.kind, scope.id, budget.period))
                if kept is not None and kept.start == start:
                    kept.micros, kept.text = budget.micros, budget.scope
                    account = kept
                else:
                    account = Account(
                        scope.kind,
                        scope.id,
                        budget.scope,
                        budget.period,
                        budget.micros,
                        start,
                        end,
                        spent=self._load(scope.kind, scope.id, start),
                    )
                accounts.setdefault((scope.kind, scope.id), []).append(account)
            self._accounts = accounts
            self._configured_for = settings
            self._retry_at = time.monotonic() + RETRY_UNRESOLVED_S if unresolved else None

    def _resolve(self, budget: Budget) -> ScopeLike | None:
        if self.resolve is None:
            kind, _, ident = budget.scope.partition(":")
            return BudgetScope(kind, ident) if ident else None
        try:
            return self.resolve(budget.scope)
        except Exception as err:  # an unknown or malformed scope must not stop the others
            log.warning("budgets: the budget for %r governs nothing: %s", budget.scope, err)
            return None

    def _load(self, kind: str, ident: str, since: datetime) -> int:
        if self.spent_since is None:
            return 0
        try:
            return int(self.spent_since(kind, ident, since))
        except Exception as err:
            log.error(
                "budgets: cannot read what %s:%s spent since %s (%s); counting from 0",
                kind,
                ident,
                since.isoformat(),
                err,
            )
            return 0

    @property
    def active(self) -> bool:
        """Any budget is in force (checked without the lock: a request without one pays nothing)."""
        self._refresh()
        return bool(self._accounts)

    def _refresh(self) -> None:
        """Configure again when the settings changed, or when a budget named a scope not found and it is time to look
        again (a team created since)."""
        if self.settings.current is not self._configured_for or (
            self._retry_at is not None and time.monotonic() >= self._retry_at
        ):
            self.configure()

    # --- the request path -----------------------------------------------------------

    def governs(self, scopes: Sequence[ScopeLike]) -> bool:
        """A budget is set on one of ``scopes``: their requests are reserved."""
        self._refresh()
        accounts = self._accounts
        if accounts:
            for scope in scopes:
                if scope.id and (scope.kind, scope.id) in accounts:
                    return True
        return False

    def fits(self, scopes: Sequence[ScopeLike], micros: int) -> bool:
        """``micros`` more would pass no budget of ``scopes`` now (a look, holding nothing and telling no one)."""
        accounts = self._accounts
        micros = max(0, int(micros))
        now = self.seconds()
        for scope in scopes:
            if scope.id and (key := (scope.kind, scope.id)) in accounts:
                for account in accounts[key]:
                    spent = 0 if now >= account.ends_at else account.spent  # a period that ended starts afresh
                    if spent + account.reserved + micros > account.micros:
                        return False
        return True

    def reserve(self, scopes: Sequence[ScopeLike], micros: int) -> Reservation:
        """Hold ``micros`` against every budgeted scope of ``scopes``; BudgetExceeded when one would pass its budget."""
        self._refresh()
        accounts = self._accounts
        found: list[Account] = []
        for scope in scopes:
            if scope.id and (key := (scope.kind, scope.id)) in accounts:
                found += accounts[key]
        if not found:
            return NO_RESERVATION
        micros = max(0, int(micros))
        now = self.seconds()
        crossed: list[Account] = []
        with self._lock:
            for account in found:
                if now >= account.ends_at:
                    account.roll(self.clock())
            for account in found:
                if account.spent + account.reserved + micros > account.micros:
                    if not account.crossed:
                        account.crossed = True
                        crossed.append(account)
                    refusal = self._refusal(account, micros, self.clock())
                    break
            else:
                for account in found:
                    account.reserved += micros
                return Reservation(self, found, micros)
        self._emit_crossed(crossed)
        raise refusal

    def _refusal(self, account: Account, micros: int, now: datetime) -> BudgetExceeded:
        left = max(0, account.micros - account.spent - account.reserved)
        message = (
            f"{account.text} has used its {ADJECTIVE[account.period]} budget of {account.micros} micros "
            f"({account.spent} spent, {account.reserved} held by requests in flight, {left} left); this request "
            f"could cost up to {micros}. The {account.period} ends at {account.end.isoformat().replace('+00:00', 'Z')}; "
            f"retry then, or ask an operator to raise the budget."
        )
        return BudgetExceeded(
            message,
            scope=account.text,
            period=account.period,
            retry_after_s=int((account.end - now).total_seconds()) + 1,
        )

    def _emit_crossed(self, crossed: list[Account]) -> None:
        if self.emit is None:
            return
        for account in crossed:
            try:
                self.emit(
                    "budget.crossed",
                    account.id,
                    {
                        "scope": account.text,
                        "period": account.period,
                        "budget_micros": account.micros,
                        "spent_micros": account.spent,
                    },
                )
            except Exception:
                log.exception("budgets: cannot emit budget.crossed for %s", account.text)

    # --- what the management API shows -------------------------------------------

    def budget_of(self, kind: str, ident: str) -> tuple[int, str] | None:
        """(micros, period) of the budget set on exactly that scope (the shortest period first), or None."""
        self._refresh()
        accounts = self._accounts.get((kind, ident))
        if not accounts:
            return None
        first = min(accounts, key=lambda a: PERIODS.index(a.period))
        return first.micros, first.period

    def spent(self, kind: str, ident: str, period: str) -> int | None:
        """The spend this leader counts for that budget now; None without one."""
        for account in self._accounts.get((kind, ident), ()):
            if account.period == period:
                return account.spent
        return None


@dataclass(frozen=True, slots=True)
class BudgetScope:
    """A scope a request is spent in, as the gateway names it: ``("project", id)``."""

    kind: str
    id: str
