"""The model lifecycle's services, built once for the composition root: serve jobs, evaluations, canaries, updates.

They sit on the fleet's services (models, placement) and ask ``/v1`` as a client would, through
the leader's own gateway (the replayer), so their requests are routed, metered and audited like
any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from opod import config
from opod.control.evals.service import EvalsService
from opod.control.serving import ServeJobs
from opod.control.update_steps import Takeover
from opod.control.updating import Updates
from opod.fleet.canaries import CanaryBook
from opod.fleet.canaries_service import CanariesService
from opod.fleet.followers import EventSink
from opod.fleet.models import ModelRegistry
from opod.fleet.models_service import ModelsService
from opod.fleet.state import Fleet
from opod.leader.batches import runner_owner
from opod.leader.reconciler import Reconciler
from opod.leader.replay import Replayer
from opod.store import Store
from opod.weights.errors import WeightsError
from opod.weights.hub import HubSettings
from opod.weights.resolver import models_dir


@dataclass(frozen=True, slots=True)
class LifecycleParts:
    serve_jobs: ServeJobs
    evals: EvalsService
    canaries: CanariesService
    updates: Updates


def build_lifecycle(
    home: Path,
    store: Store,
    models: ModelRegistry,
    models_service: ModelsService,
    fleet: Fleet,
    reconciler: Reconciler,
    replayer: Replayer,
    canary_book: CanaryBook,
    emit: EventSink,
) -> LifecycleParts:
    """Raises ``ValueError`` when the Hub's settings (``HF_ENDPOINT``, ``HF_TOKEN``...) are unusable."""
    try:
        hub = HubSettings.from_config()
    except WeightsError as err:
        raise ValueError(str(err)) from None
    runner = runner_owner(home)
    serve_jobs = ServeJobs(
        store,
        models,
        models_service,
        fleet,
        reconciler,
        replayer,
        hub=hub,
        weights_dir=models_dir(home) / "hf",
        runner=runner,
    )
    serve_jobs.fail_interrupted()
    # Quality runs ask /v1 as the operator's own requests do: through the gateway, as the admin key.
    evals = EvalsService(store, models, models_service, replayer.replay, eval_dir=config.eval_dir(home), owner=runner)
    canaries = CanariesService(
        models_service,
        models,
        fleet,
        canary_book,
        emit,
        gate=evals,
        record=store.record_audit,
        jobs=store,
        runner=runner,
    )
    # An update's new weights run as a hidden candidate behind the canaries' mechanism, held to the evals' gate.
    takeover = Takeover(models, models_service, canaries, evals, fleet, reconciler)
    updates = Updates(models, models_service, serve_jobs, evals, takeover, store, hub=hub)
    return LifecycleParts(serve_jobs=serve_jobs, evals=evals, canaries=canaries, updates=updates)
