"""Health is kept per served model on a worker: one model's failures, crash or cool-down leave the worker's
other models serving, a restarted engine takes work as soon as it is reported back, and while a model cannot
serve, one function says why (the 503, ``/readyz``, ``opod model ls`` and the node listings all ask it)."""

from __future__ import annotations

import time

from opod.contract import nodeapi
from opod.fleet.liveness import model_states
from opod.fleet.router import Router, RouteRequest
from opod.fleet.state import COOLDOWN_AFTER, COOLDOWN_SECONDS, Fleet

CHAT, EMBED = "chat", "embed"


def join(fleet: Fleet, node_id: str, models: list[str]) -> None:
    fleet.register(
        nodeapi.RegisterRequest(id=node_id, address=f"{node_id}:8081", boot_id="b"), "t", nodeapi.Capabilities()
    )
    beat(fleet, node_id, models)


def beat(
    fleet: Fleet, node_id: str, models: list[str], engines: dict[str, nodeapi.EngineState] | None = None, **extra
) -> None:
    node = fleet.heartbeat(
        nodeapi.Heartbeat(
            id=node_id,
            boot_id="b",
            loaded_models=models,
            slots=4,
            model_engines=engines,
            engine=nodeapi.EngineState(state="serving"),
            **extra,
        )
    )
    assert node is not None


def fail(fleet: Fleet, node_id: str, model: str, times: int = COOLDOWN_AFTER) -> None:
    node = fleet.get(node_id)
    assert node is not None
    for _ in range(times):
        fleet.failed(node, model, "connection refused")


def test_three_failures_of_one_model_leave_the_other_model_on_the_same_worker_served() -> None:
    fleet = Fleet()
    join(fleet, "n1", [CHAT, EMBED])
    fail(fleet, "n1", CHAT)
    assert [n.id for n in fleet.live()] == ["n1"], "the worker itself still takes work"
    assert fleet.workers_for(EMBED) == [fleet.get("n1")]
    assert Router(fleet).pick(RouteRequest(EMBED)) is not None
    assert fleet.workers_for(CHAT) == [] and Router(fleet).pick(RouteRequest(CHAT)) is None
    assert fleet.served_models() == {EMBED}
    availability = fleet.availability(CHAT)
    assert not availability.ok
    assert availability.why() == "n1: cooling down after 3 failed requests"
    assert availability.told_operators() == "n1: cooling down after 3 failed requests (last: connection refused)"
    assert 1 <= availability.retry_after() <= COOLDOWN_SECONDS
    assert fleet.availability(EMBED).ok


def test_a_success_ends_a_run_of_failures_before_it_cools_the_model_down() -> None:
    fleet = Fleet()
    join(fleet, "n1", [CHAT])
    node = fleet.get("n1")
    assert node is not None
    fail(fleet, "n1", CHAT, COOLDOWN_AFTER - 1)
    fleet.succeeded(node, CHAT)
    fail(fleet, "n1", CHAT, COOLDOWN_AFTER - 1)
    assert fleet.serves(CHAT)


def test_a_crashed_engine_says_so_and_its_model_takes_work_as_soon_as_it_is_reported_back() -> None:
    fleet = Fleet()
    join(fleet, "n1", [CHAT, EMBED])
    fail(fleet, "n1", CHAT)  # the requests that met the dead engine before the worker said so
    crashed = nodeapi.EngineState(state="starting", restarts=0, detail="killed by SIGKILL")
    beat(fleet, "n1", [EMBED], {CHAT: crashed, EMBED: nodeapi.EngineState(state="serving")})
    assert fleet.availability(CHAT).why() == "n1: its engine crashed and is restarting"
    assert fleet.availability(CHAT).told_operators() == "n1: its engine crashed (killed by SIGKILL) and is restarting"
    assert fleet.availability(CHAT).retry_after() <= 5
    assert fleet.serves(EMBED)
    node = fleet.get("n1")
    assert node is not None and model_states(node, time.monotonic())[CHAT].startswith("its engine crashed")
    beat(
        fleet,
        "n1",
        [CHAT, EMBED],
        {CHAT: nodeapi.EngineState(state="serving", restarts=1), EMBED: nodeapi.EngineState(state="serving")},
    )
    assert fleet.serves(CHAT), "the engine is back: its cool-down ended with the heartbeat that said so"
    assert model_states(node, time.monotonic()) == {CHAT: "serving", EMBED: "serving"}


def test_an_engine_restarted_between_two_heartbeats_takes_work_again_at_once() -> None:
    fleet = Fleet()
    join(fleet, "n1", [CHAT])
    beat(fleet, "n1", [CHAT], {CHAT: nodeapi.EngineState(state="serving")})
    fail(fleet, "n1", CHAT)
    assert not fleet.serves(CHAT)
    beat(fleet, "n1", [CHAT], {CHAT: nodeapi.EngineState(state="serving", restarts=1)})
    assert fleet.serves(CHAT)


def test_each_reason_a_model_cannot_serve_is_said_with_an_honest_retry_after_and_its_detail_to_operators_only() -> None:
    fleet = Fleet()
    join(fleet, "n1", [])
    beat(fleet, "n1", [], load_progress={CHAT: "fetching weights 40%"})
    assert fleet.availability(CHAT).why() == "n1: loading (fetching weights 40%)"
    beat(fleet, "n1", [], load_errors={CHAT: "chat: exit status 1 (unknown model architecture)"})
    assert fleet.availability(CHAT).why() == "n1: failed to load"
    assert (
        fleet.availability(CHAT).told_operators()
        == "n1: failed to load: chat: exit status 1 (unknown model architecture)"
    )
    assert fleet.availability(CHAT).retry_after() >= 20
    looping = nodeapi.EngineState(state="crash-looping", restarts=3, detail="exit status 134")
    beat(fleet, "n1", [], {CHAT: looping})
    assert (
        fleet.availability(CHAT).why()
        == "n1: its engine keeps crashing, restarted 3 times; restarting after a back-off"
    )
    assert (
        fleet.availability(CHAT).told_operators()
        == "n1: its engine keeps crashing (exit status 134), restarted 3 times; restarting after a back-off"
    )
    assert fleet.availability("nobody-has-it").why() == "no worker holds it yet"


def test_opod_model_ls_says_what_the_503_says() -> None:
    from opod.fleet.models import ANY_NODE, KnownModel, ModelRegistry
    from opod.http.nodeclient import WorkerClient
    from opod.leader.reconciler import Reconciler
    from opod.security.signer import Signer

    fleet, models = Fleet(), ModelRegistry()
    for model in (CHAT, EMBED):
        models.put(KnownModel(id=model, wanted={ANY_NODE: "loaded"}))
    reconciler = Reconciler(fleet, models, WorkerClient(lambda _: "t", Signer))
    join(fleet, "n1", [CHAT, EMBED])
    join(fleet, "n2", [CHAT])
    fail(fleet, "n2", CHAT)
    assert (
        reconciler.status(CHAT) == "serving on n1 (n2: cooling down after 3 failed requests (last: connection refused))"
    )
    beat(fleet, "n1", [EMBED], {CHAT: nodeapi.EngineState(state="starting", detail="killed by SIGKILL")})
    assert reconciler.status(CHAT) == (
        "cannot serve: n1: its engine crashed (killed by SIGKILL) and is restarting; "
        "n2: cooling down after 3 failed requests (last: connection refused)"
    )
    assert reconciler.status(EMBED) == "serving on n1"


def test_the_context_a_model_is_served_with_is_the_smallest_its_workers_report() -> None:
    fleet = Fleet()
    join(fleet, "n1", [CHAT])
    assert fleet.served_context(CHAT) is None, "not said: the catalog's window stands"
    beat(fleet, "n1", [CHAT], model_context={CHAT: 8192})
    join(fleet, "n2", [CHAT])
    beat(fleet, "n2", [CHAT], model_context={CHAT: 4096})
    assert fleet.served_context(CHAT) == 4096, "a request may be routed to either"
    fail(fleet, "n2", CHAT)
    assert fleet.served_context(CHAT) == 8192, "only where it can be routed now"
