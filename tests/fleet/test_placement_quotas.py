"""Quotas in placement: a scope at its limit gets no new replica, a guarantee is kept free, nested scopes count up."""

from __future__ import annotations

from opod.fleet.placed import EVERY_NODE, Held
from opod.fleet.placement import Planner
from opod.fleet.quotas import Amount, Bounds, Quota, QuotaBook
from tests.fleet.test_placement import NOW, gpu, model, node

ACME = "org:o1"
ML = "team:t1"
WEB = "team:t2"
CHAT = "project:p1"

OWNERS = {"chat-model": (CHAT, ML, ACME), "ml-model": (ML, ACME), "web-model": (WEB, ACME), "shared": ()}
WITHIN = {CHAT: (ML, ACME), ML: (ACME,), WEB: (ACME,), ACME: ()}


def quota(scope: str, *, limit: Bounds | None = None, guarantee: Bounds | None = None, name: str = "") -> Quota:
    return Quota(scope=scope, limit=limit or Bounds(), guarantee=guarantee or Bounds(), within=WITHIN[scope], name=name)


def planner(nodes, held, *quotas: Quota) -> Planner:
    return Planner(nodes, held, now=NOW, quotas=QuotaBook.of(quotas, OWNERS))


def holding(replica: str, model_id: str, node_id: str, *devices: int) -> Held:
    return Held(replica, model_id, 0, "standard", gpus={node_id: list(devices)})


def fleet(count: int = 2, per_node: int = 4):
    return [node(f"n{i}", {"A10G": per_node}) for i in range(1, count + 1)]


def test_a_team_at_its_gpu_limit_gets_no_new_replica_and_every_node_hears_why() -> None:
    held = [holding("r1", "ml-model", "n1", 0, 1, 2, 3)]
    plan = planner(fleet(), held, quota(ML, limit=Bounds(gpus=4), name="Acme / ml"))
    assignment, rejections = plan.place("ml-model", model(gpu("A10G", tp=2)), klass="standard")
    assert assignment is None
    assert [(r.node, r.reason) for r in rejections] == [
        (EVERY_NODE, "quota: team:t1 (Acme / ml) holds 4 of 4 GPUs (its limit); this replica needs 2 more")
    ]
    assert plan.quotas is not None and plan.quotas.held_by(ML) == Amount(4, 0, 0)


def test_under_its_limit_a_scope_places_until_the_limit_and_then_stops() -> None:
    plan = planner(fleet(4, per_node=1), [], quota(ML, limit=Bounds(gpus=3)))
    for n in range(3):
        assignment, _ = plan.place("ml-model", model(gpu("A10G")), klass="standard", exclude={})
        assert assignment is not None, n
        plan.take(assignment, f"r{n}", "standard")
    fourth, rejections = plan.place("ml-model", model(gpu("A10G")), klass="standard")
    assert fourth is None and rejections[0].reason.startswith("quota: team:t1 holds 3 of 3 GPUs")


def test_a_released_replica_gives_its_gpus_back_to_the_scope() -> None:
    held = [holding("r1", "ml-model", "n1", 0, 1)]
    plan = planner(fleet(), held, quota(ML, limit=Bounds(gpus=2)))
    assert plan.place("ml-model", model(gpu("A10G")), klass="standard")[0] is None
    plan.release("r1")
    assert plan.place("ml-model", model(gpu("A10G")), klass="standard")[0] is not None


def test_a_project_counts_against_its_team_and_org_and_the_tightest_one_refuses() -> None:
    held = [holding("r1", "web-model", "n1", 0, 1, 2)]
    plan = planner(fleet(), held, quota(ACME, limit=Bounds(gpus=4), name="Acme"), quota(ML, limit=Bounds(gpus=8)))
    assignment, rejections = plan.place("chat-model", model(gpu("A10G", tp=2)), klass="standard")
    assert assignment is None
    assert rejections[0].reason == "quota: org:o1 (Acme) holds 3 of 4 GPUs (its limit); this replica needs 2 more"
    # One GPU still fits under the org.
    assert plan.place("chat-model", model(gpu("A10G")), klass="standard")[0] is not None


def test_a_shared_model_is_ungoverned_and_a_model_of_another_scope_ignores_a_limit() -> None:
    held = [holding("r1", "ml-model", "n1", 0, 1, 2, 3)]
    plan = planner(fleet(), held, quota(ML, limit=Bounds(gpus=4)))
    assert plan.place("shared", model(gpu("A10G")), klass="standard")[0] is not None
    assert plan.place("web-model", model(gpu("A10G")), klass="standard")[0] is not None


def test_a_quota_refusal_falls_through_to_a_profile_that_fits_the_limit() -> None:
    plan = planner(fleet(), [], quota(ML, limit=Bounds(gpus=0)))
    assignment, rejections = plan.place(
        "ml-model", model(gpu("A10G", name="gpu"), gpu(None, name="cpu", engine="vllm")), klass="standard"
    )
    assert assignment is not None and assignment.gpus == {assignment.nodes[0]: []}
    assert [r.profile for r in rejections] == ["gpu"] and rejections[0].reason.startswith(
        "quota: team:t1 holds 0 of 0 GPUs"
    )


def test_an_ungoverned_resource_is_not_limited_by_a_limit_on_another() -> None:
    plan = planner(fleet(), [], quota(ML, limit=Bounds(cpu_cores=4)))
    assert plan.place("ml-model", model(gpu("A10G", tp=4)), klass="standard")[0] is not None
    refused, rejections = plan.place("ml-model", model(gpu(None, cpu_cores=8)), klass="standard")
    assert refused is None and rejections[0].reason.startswith("quota: team:t1 holds 0 of 4 CPU cores")


def test_a_guarantee_keeps_gpus_free_from_another_scopes_model() -> None:
    # 8 GPUs, 4 of them held by the shared model; web is guaranteed 4 and holds none: nothing is left for ml.
    held = [holding("s", "shared", "n1", 0, 1, 2, 3)]
    plan = planner(fleet(), held, quota(WEB, guarantee=Bounds(gpus=4), name="Acme / web"))
    assignment, rejections = plan.place("ml-model", model(gpu("A10G")), klass="standard")
    assert assignment is None
    assert rejections[0].reason == (
        "quota: team:t2 (Acme / web) holds 0 of its guarantee of 4 GPUs, so 4 stay free for guarantees; "
        "4 are free and this replica needs 1"
    )
    # The guaranteed team itself may take them.
    mine, _ = plan.place("web-model", model(gpu("A10G", tp=4)), klass="standard")
    assert mine is not None and mine.nodes == ["n2"]


def test_what_a_guaranteed_scope_holds_counts_toward_its_guarantee() -> None:
    held = [holding("w", "web-model", "n1", 0, 1, 2)]
    plan = planner(fleet(), held, quota(WEB, guarantee=Bounds(gpus=4)))
    # 5 free, web lacks 1 of its guarantee: ml may take 4 and not 5.
    assert plan.place("ml-model", model(gpu("A10G", tp=4)), klass="standard")[0] is not None
    held.append(holding("m", "ml-model", "n2", 0))
    plan = planner(fleet(), held, quota(WEB, guarantee=Bounds(gpus=4)))
    refused, rejections = plan.place("ml-model", model(gpu("A10G", tp=4)), klass="standard")
    assert refused is None and "4 are free and this replica needs 4" in rejections[0].reason


def test_nested_guarantees_are_counted_once_and_a_sibling_keeps_its_own() -> None:
    # Acme is guaranteed 6 and ml, inside it, 4: 6 stay free for Acme in all, not 10.
    quotas = (quota(ACME, guarantee=Bounds(gpus=6)), quota(ML, guarantee=Bounds(gpus=4)))
    plan = planner(fleet(), [], *quotas)
    assert plan.place("shared", model(gpu("A10G", tp=2)), klass="standard")[0] is not None
    assert plan.place("shared", model(gpu("A10G", tp=3)), klass="standard")[0] is None
    # web is inside Acme but not ml: Acme's own guarantee does not stop it, ml's does (8 free, 4 kept for ml).
    assert plan.place("web-model", model(gpu("A10G", tp=4)), klass="standard")[0] is not None
    assert (
        plan.place(
            "web-model", model(gpu("A10G", tp=4), gpu("A10G", tp=2, gpus_per_node=1, nodes=2)), klass="standard"
        )[0]
        is not None
    )
    held = [holding("w", "web-model", "n1", 0, 1, 2)]
    refused, rejections = planner(fleet(), held, *quotas).place("web-model", model(gpu("A10G", tp=2)), klass="standard")
    assert refused is None and "team:t1 holds 0 of its guarantee of 4 GPUs" in rejections[0].reason
    # A model of ml itself takes from both.
    assert planner(fleet(), held, *quotas).place("ml-model", model(gpu("A10G", tp=4)), klass="standard")[0] is not None


def test_without_quotas_the_planner_places_as_before() -> None:
    assert Planner(fleet(), [], now=NOW).place("ml-model", model(gpu("A10G")), klass="standard")[0] is not None
    assert planner(fleet(), []).place("ml-model", model(gpu("A10G")), klass="standard")[0] is not None
