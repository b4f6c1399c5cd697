"""The gateway built whole: the one place its parts are wired, for the leader and for the gateway's tests.

:func:`build_gateway` takes what differs between a leader and a test (where usage rows go, the mounted
files, the admission before a policy says otherwise, whether keys are required, the cluster's rules)
and builds the rest the same way every time: the relay with its affinity pins, the prefix hasher and
the prompt counter on the workers' tokenizer, admission on the fleet's capacity, the guardrails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import Any

from opod.access.guard_attachments import AttachmentTable
from opod.access.keytable import KeyTable
from opod.access.tenancy import Tenancy
from opod.contract.adminapi import PolicyAdmission
from opod.fleet.affinity import AffinityTable
from opod.fleet.canaries import CanaryBook
from opod.fleet.federation import Federation
from opod.fleet.local import LocalEngines
from opod.fleet.models import ModelRegistry
from opod.fleet.prefix_index import PrefixIndex
from opod.fleet.router import Router
from opod.fleet.state import Fleet
from opod.gateway.admission import Admission, fleet_capacity
from opod.gateway.app import Demand, Gateway, Policies
from opod.gateway.budgets import Budgets
from opod.gateway.guard import GuardPolicies
from opod.gateway.guardrails import Guardrails
from opod.gateway.kept_bodies import BodyKeeping, BodySink
from opod.gateway.meter import UsageRecorder
from opod.gateway.prefix import PrefixHasher
from opod.gateway.profiles import RoutingProfiles
from opod.gateway.relay import Relay
from opod.gateway.templatecost import TemplateCosts
from opod.gateway.tokenize import worker_tokenizer
from opod.gateway.usagecount import PromptCounter
from opod.http.nodeclient import WorkerClient
from opod.settings.holder import SettingsHolder


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterRules:
    """What the cluster adds to each request: its settings' routing profiles, kept bodies and default
    ``max_tokens``, its
    tenancy tree, and the demand that starts an on-demand model. A leader's gateway has them; a test's may go
    without, and then no budget, profile, kept body or project applies."""

    settings: SettingsHolder
    tenancy: Tenancy
    bodies: BodySink
    """Where kept request bodies are written (``Ledger.bodies``)."""
    demand: Demand
    """Told of every request's model (``Reconciler.requested``)."""
    federation: Federation
    """Other clusters whose models are named ``PEER/MODEL``, and this cluster's id for the hop header."""
    guard_attachments: AttachmentTable
    """Where the settings' guard policies are attached, beside the ones every request gets."""


def settings_reader(holder: SettingsHolder, path: str) -> Callable[[], Any]:
    """Reads the dotted ``path`` of ``holder`` (``current.generation.default_max_tokens``) anew at each call."""
    # A partial of an attrgetter, not a lambda: both are C, and several of these are read on every request.
    return partial(attrgetter(path), holder)


def build_gateway(
    *,
    fleet: Fleet,
    models: ModelRegistry,
    keys: KeyTable,
    workers: WorkerClient,
    index: PrefixIndex,
    local: LocalEngines,
    usage: UsageRecorder,
    policies: Policies,
    admission: PolicyAdmission,
    require_keys: bool = True,
    budgets: Budgets | None = None,
    rules: ClusterRules | None = None,
    canaries: CanaryBook | None = None,
) -> Gateway:
    """A gateway on ``fleet``: ``index`` is the prefix index the reconciler sweeps too, ``local`` the engines of a
    worker in this process, ``admission`` the policy in force until a mounted one replaces it, ``budgets`` the
    settings' budgets with what each scope has spent (none: no request is refused for its cost)."""
    tokenize = worker_tokenizer(fleet, workers)
    profiles: RoutingProfiles | None = None
    bodies: BodyKeeping | None = None
    default_max_tokens: Callable[[], int] | None = None
    guard: GuardPolicies | None = None
    if rules is not None:
        settings, tenancy = rules.settings, rules.tenancy
        profiles = RoutingProfiles(settings_reader(settings, "current.routing_profiles"))
        bodies = BodyKeeping(
            settings_reader(settings, "current"),
            rules.bodies,
            lambda text: tenancy.resolve(text, kinds=("project",)).id,
        )
        default_max_tokens = settings_reader(settings, "current.generation.default_max_tokens")
        guard = GuardPolicies(settings_reader(settings, "current"), rules.guard_attachments)
    return Gateway(
        fleet=fleet,
        models=models,
        keys=keys,
        relay=Relay(fleet, workers, router=Router(fleet, index, AffinityTable()), local=local),
        admission=Admission(fleet_capacity(fleet), admission),
        usage=usage,
        prefix=PrefixHasher(fleet, index, tokenize),
        policies=policies,
        guardrails=Guardrails(),
        prompts=PromptCounter(tokenize),
        templates=TemplateCosts(tokenize),
        require_keys=require_keys,
        demand=rules.demand if rules is not None else None,
        tenancy=rules.tenancy if rules is not None else None,
        budgets=budgets,
        profiles=profiles,
        bodies=bodies,
        default_max_tokens=default_max_tokens,
        federation=rules.federation if rules is not None else None,
        canaries=canaries,
        guard=guard,
    )
