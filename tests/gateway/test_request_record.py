"""The request record owns its life cycle: each stage is told to it, and its end lets go of everything it holds."""

from __future__ import annotations

from opod.access.keytable import KeyEntry
from opod.access.tenancy import ProjectChain
from opod.contract.adminapi import PolicyAdmission
from opod.fleet.state import Fleet
from opod.gateway.admission import Admission
from opod.gateway.budgets import Budget, BudgetScope
from opod.gateway.exchange import Exchange
from opod.gateway.meter import Meter
from opod.gateway.outcome import Outcome
from tests.fleet.test_leases_and_capacity import MODEL, join
from tests.gateway.test_budgets import ORG, PROJECT, TEAM, budgets
from tests.gateway.test_relay import Usage

KEY = KeyEntry("k_chat", "api", "chat", "h" * 64, project_id=PROJECT.id, user_id="usr_1")


class Chains:
    def chain(self, project_id: str) -> ProjectChain | None:
        return ProjectChain(project_id, TEAM.id, ORG.id) if project_id == PROJECT.id else None


def test_the_end_lets_go_of_the_slot_the_worker_and_the_reservation_once() -> None:
    held, _, _ = budgets(Budget(scope="project:acme/ml/chat", period="day", micros=1_000_000))
    usage, fleet = Usage(), Fleet()
    join(fleet, "a")
    node = fleet.get("a")
    assert node is not None
    admission = Admission(lambda model: 2, PolicyAdmission())
    record = Exchange(Meter(usage, budgets=held, tenancy=Chains()), "r1", "openai.chat.completions", False, False)
    record.identified(KEY)
    assert record.scopes == (
        BudgetScope("key", "k_chat"),
        BudgetScope("user", "usr_1"),
        PROJECT,
        TEAM,
        ORG,
    ), "attributed to the key's person and project, and the project's team and org"
    record.parsed(MODEL, {"model": MODEL, "messages": []})
    assert record.budgeted
    record.reserved(600_000)
    permit = admission.admit_now(MODEL, "standard")
    assert permit is not None
    record.admitted(permit, "standard")
    record.relaying()
    record.leased(fleet.lease(node, "m"))
    record.leased(fleet.lease(node, "m"))  # a second attempt: the first one's hold goes
    assert node.in_flight == 1 and admission.stats()[MODEL].in_use == 1
    record.sent()
    record.ended(Outcome(200, "ok", "a", {"prompt_tokens": 10, "completion_tokens": 5}))
    assert node.in_flight == 0 and admission.stats()[MODEL].in_use == 0
    assert record.reservation.settled
    record.ended(Outcome(500, "error"))  # a later end changes nothing
    [row] = usage.rows
    assert row.ended["outcome"] == "ok" and row.ended["cost_micros"] > 0
    # What the reservation held is given back: a request of the same size fits again.
    second = Exchange(Meter(usage, budgets=held, tenancy=Chains()), "r2", "openai.chat.completions", False, False)
    second.identified(KEY)
    second.reserved(600_000)  # BudgetExceeded had the first one's hold stayed
    assert second.reservation.micros == 600_000


def test_an_answer_held_for_the_guardrails_frees_the_engine_at_once_and_writes_its_row_after_the_verdict() -> None:
    usage, fleet = Usage(), Fleet()
    join(fleet, "a")
    node = fleet.get("a")
    assert node is not None
    record = Exchange(Meter(usage), "r1", "openai.chat.completions", False, False)
    record.identified(None)
    record.parsed(MODEL, {"model": MODEL})
    record.relaying(hold=True)
    record.leased(fleet.lease(node, "m"))
    record.sent()
    record.ended(Outcome(200, "ok", "a", {"prompt_tokens": 1, "completion_tokens": 1}))
    assert node.in_flight == 0 and usage.rows[0].ended == {}, "the engine is free; the row waits for the verdict"
    record.let_through()
    assert usage.rows[0].ended["outcome"] == "ok"


def test_a_request_refused_before_any_engine_is_counted_refused_and_holds_nothing() -> None:
    usage = Usage()
    meter = Meter(usage)
    record = Exchange(meter, "r1", "openai.chat.completions", False, False)
    record.identified(KEY)
    record.refused(400)
    assert meter.stats.in_flight == 0
    [row] = usage.rows
    assert row.ended["outcome"] == "error" and row.ended["details"]["status"] == 400


def test_a_key_s_attribution_is_made_once_and_again_when_its_entry_or_its_project_s_place_changes() -> None:
    class Tree:
        def __init__(self) -> None:
            self.chains = {PROJECT.id: ProjectChain(PROJECT.id, TEAM.id, ORG.id)}

        def chain(self, project_id: str) -> ProjectChain | None:
            return self.chains.get(project_id)

    tree = Tree()
    meter = Meter(Usage(), tenancy=tree)

    def scopes(key: KeyEntry) -> tuple[BudgetScope, ...]:
        record = Exchange(meter, "r", "openai.chat.completions", False, False)
        record.identified(key)
        return record.scopes

    first = scopes(KEY)
    assert scopes(KEY) is first, "the same key and tree: the attribution made at the key's first request"

    tree.chains = {PROJECT.id: ProjectChain(PROJECT.id, "t_other", ORG.id)}  # the project moved to another team
    assert BudgetScope("team", "t_other") in scopes(KEY) and TEAM not in scopes(KEY)

    moved = KeyEntry(KEY.id, "api", "chat", "h" * 64, project_id="p_gone", user_id="usr_1")  # the key re-read
    assert scopes(moved) == (BudgetScope("key", KEY.id), BudgetScope("user", "usr_1"), BudgetScope("project", "p_gone"))

    from_file = KeyEntry("ci", "api", "ci", "f" * 64, source="snapshot")
    assert scopes(from_file) == (BudgetScope("key", "k_cp_ci"),), "a mounted key is spent under its k_cp_ id"


def test_server_timing_says_each_part_in_milliseconds_to_three_places() -> None:
    record = Exchange(Meter(Usage()), "r1", "openai.chat.completions", False, False)
    assert record.server_timing() is None, "no upstream answered: no timing"
    record.started -= 0.0123456  # 12.3456 ms ago
    record.answered(0.0040004)
    timing = record.server_timing()
    assert timing is not None
    own, upstream = (part.split(b"=")[1] for part in timing.split(b", "))
    assert upstream == b"4.000" and own.count(b".") == 1 and len(own.split(b".")[1]) == 3
    assert 8.345 <= float(own) < 8.345 + 50, timing  # 12.3456 - 4.0004 ms, and the time this test took since
