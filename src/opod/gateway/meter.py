"""What every ``/v1`` request's record reports to (:class:`Meter`, made once by the gateway), and what a key's
requests are attributed to (:class:`Attribution`, made once per key): the shared side of
:class:`opod.gateway.exchange.Exchange`, the per-request one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from opod.access.keytable import KeyEntry
from opod.contract.adminapi import SNAPSHOT_KEY_PREFIX
from opod.gateway.budgets import Budgets, BudgetScope
from opod.gateway.stats import GatewayStats
from opod.gateway.usagecount import DecodeRates, PromptCounter
from opod.ledger.records import UsageTicket


class UsageRecorder(Protocol):
    """Where usage rows go: what the gateway calls on ``opod.ledger.Ledger``."""

    def begin(
        self,
        *,
        request_id: str,
        api_key_id: str,
        user_id: str,
        model: str,
        protocol: str,
        project_id: str = "",
        team_id: str = "",
        org_id: str = "",
        end_user: str = "",
        tags: Mapping[str, str] | None = None,
        details: Mapping[str, object] | None = None,
    ) -> UsageTicket: ...

    def end(
        self,
        ticket: UsageTicket,
        *,
        outcome: str,
        prompt_tokens: int,
        completion_tokens: int,
        latency_ms: int,
        ttft_ms: int = 0,
        node_id: str = "",
        route: Mapping[str, object] | None = None,
        cost_micros: int = 0,
        details: Mapping[str, object] | None = None,
    ) -> None: ...

    def progress(
        self, ticket: UsageTicket, *, prompt_tokens: int, completion_tokens: int, node_id: str = ""
    ) -> None: ...


class ProjectChain(Protocol):
    """A project's place in the tenancy tree (``opod.access.tenancy.ProjectChain``)."""

    @property
    def team_id(self) -> str: ...

    @property
    def org_id(self) -> str: ...


class Chains(Protocol):
    """The tenancy tree as the gateway reads it per request (``opod.access.tenancy.Tenancy``): a dict look-up."""

    def chain(self, project_id: str) -> ProjectChain | None: ...


@dataclass(slots=True)
class Meter:
    """What every request's record reports to, made once by the gateway: the counters, the usage rows,
    the prompt counter and decode rates for rows the engine could not complete, the budgets, the tenancy."""

    ledger: UsageRecorder
    stats: GatewayStats = field(default_factory=GatewayStats)
    prompts: PromptCounter | None = None
    """Counts the prompt of a stream that ended before the engine's usage chunk; ``None``: recorded as 0."""
    budgets: Budgets | None = None
    """Prices each request at its end and settles its reservation; ``None``: requests cost nothing."""
    rates: DecodeRates | None = None
    """The models' decode rates: taught by each answer, and what a whole answer left by its client is estimated by."""
    tenancy: Chains | None = None
    """Each request's project → its team and org."""
    attributions: dict[str, Attribution] = field(default_factory=dict)
    """key id → what its requests are attributed to, made at its first request (:meth:`Exchange.identified`)."""


ATTRIBUTIONS_KEPT = 100_000
"""Keys whose attribution is kept at once; past it, the table starts again."""


@dataclass(frozen=True, slots=True)
class Attribution:
    """What a key's requests are attributed to: made once per key entry and project chain, read by each request."""

    key: KeyEntry
    chain: ProjectChain | None
    key_id: str
    team_id: str
    org_id: str
    scopes: tuple[BudgetScope, ...]
    """The scopes its requests are spent in, narrowest first: its key, person, project, team and org."""

    @classmethod
    def of(cls, key: KeyEntry, chain: ProjectChain | None) -> Attribution:
        # Keys from the mounted auth file are recorded as k_cp_<id>, so a manager finds its own ids.
        from_file = key.source == "snapshot"
        key_id = SNAPSHOT_KEY_PREFIX + key.id.removeprefix(SNAPSHOT_KEY_PREFIX) if from_file else key.id
        # A project deleted since the key was read (no chain): attributed to the project alone.
        team_id, org_id = (chain.team_id, chain.org_id) if chain is not None else ("", "")
        pairs = (
            ("key", key_id),
            ("user", key.user_id),
            ("project", key.project_id),
            ("team", team_id),
            ("org", org_id),
        )
        return cls(
            key, chain, key_id, team_id, org_id, tuple(BudgetScope(kind, ident) for kind, ident in pairs if ident)
        )
