"""The operator console's pages on a leader in this process, seen by a fixed person (sessions are the sign-in area's).

Each page answers its rows, pages and filters on the server, and escapes what users wrote; an action
without the session's CSRF token, or by a viewer, is refused and changes nothing; an action is audited
as the management API's call, ``source: web``, with the person as the actor.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from opod.control.console.kit import FRAGMENT_HEADER
from tests.support.console import ConsoleSite, console_as, stored_nodes
from tests.support.inprocess import InProcessLeader
from tests.support.site import FixedViewer

EVIL = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessLeader]:
    home = tmp_path_factory.mktemp("console") / "home"
    stored_nodes(home, 60, labels={"team": EVIL})
    up = InProcessLeader(home)
    yield up
    up.stop()


admin = console_as("admin")


viewer = console_as("viewer")


def node_state(leader: InProcessLeader, node_id: str) -> tuple[bool, bool]:
    """(drained, cordoned) as the fleet holds them."""
    node = leader.leader.fleet.get(node_id)
    assert node is not None
    return node.drained, node.cordoned


def row_ids(html: str) -> list[str]:
    return re.findall(r'<th scope="row">(fs-\d{4})<br>', html)


def test_nobody_signed_in_is_sent_to_sign_in_with_the_page_asked_for(leader: InProcessLeader) -> None:
    site = ConsoleSite(leader, FixedViewer(None))
    try:
        answer = site.get("/console/nodes?q=fs-0001")
        assert answer.status_code == 303
        assert answer.headers["location"] == "/signin?next=%2Fconsole%2Fnodes%3Fq%3Dfs-0001"
        refused = site.post("/console/nodes/fs-0001/state", {"state": "drain"}, csrf="")
        assert refused.status_code == 401 and "not signed in" in refused.json()["error"]
    finally:
        site.close()


def test_the_summary_shows_nodes_gpus_by_class_and_traffic(admin: ConsoleSite) -> None:
    page = admin.get("/console")
    assert page.status_code == 200
    text = page.text
    assert '<p class="big">60</p>' in text  # nodes
    assert "H100-80GB" in text and "A100-80GB" in text
    assert 'aria-current="page"' in text and 'role="status"' in text and 'aria-live="polite"' in text
    assert "Admin Person" in text


def test_nodes_page_on_the_server_and_filter_and_escape_labels(admin: ConsoleSite) -> None:
    first = admin.get("/console/nodes?size=25")
    assert first.status_code == 200
    assert row_ids(first.text) == [f"fs-{i:04d}" for i in range(25)]
    assert "60 of 60 nodes · page 1 of 3" in first.text
    second = admin.get("/console/nodes?size=25&page=3")
    assert row_ids(second.text) == [f"fs-{i:04d}" for i in range(50, 60)]
    found = admin.get("/console/nodes?q=fs-0042")
    assert row_ids(found.text) == ["fs-0042"]
    assert EVIL not in first.text and "team=&lt;script&gt;alert(1)&lt;/script&gt;" in first.text
    fragment = admin.get("/console/nodes?size=25&page=2", headers={FRAGMENT_HEADER: "rows"})
    assert "<html" not in fragment.text and row_ids(fragment.text)[0] == "fs-0025"
    wrong = admin.get("/console/nodes?state=sleeping")
    assert wrong.status_code == 400 and "state: &#39;sleeping&#39; is not one of" in wrong.text


def test_draining_a_node_is_the_api_call_audited_from_the_web_by_the_person(
    admin: ConsoleSite, leader: InProcessLeader
) -> None:
    answer = admin.post("/console/nodes/fs-0007/state", {"state": "cordon"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["message"] == "fs-0007 is cordoned"
    rows = admin.audit("fs-0007")
    assert rows[0]["action"] == "POST /api/v1/nodes/{id}/state" and rows[0]["target"] == "node:fs-0007"
    assert rows[0]["source"] == "web" and rows[0]["actor"] == "admin@example.com" and rows[0]["status"] == 200
    node = leader.leader.fleet.get("fs-0007")
    assert node is not None and node.cordoned  # its state word stays "unreachable" while it sends no heartbeat
    assert "fs-0007" in row_ids(admin.get("/console/nodes?state=unreachable").text)
    admin.post("/console/nodes/fs-0007/state", {"state": "ready"})


def test_an_action_without_the_csrf_token_is_refused_recorded_and_changes_nothing(
    admin: ConsoleSite, leader: InProcessLeader
) -> None:
    before = node_state(leader, "fs-0011")
    for token in (None, "someone-elses-token"):
        refused = admin.post("/console/nodes/fs-0011/state", {"state": "drain"}, csrf=token)
        assert refused.status_code == 403 and "X-CSRF-Token" in refused.json()["error"]
    assert node_state(leader, "fs-0011") == before
    rows = admin.audit("fs-0011")
    assert [r["status"] for r in rows[:2]] == [403, 403] and all(r["source"] == "web" for r in rows[:2])


def test_a_viewer_sees_no_change_buttons_and_their_post_is_refused(
    viewer: ConsoleSite, leader: InProcessLeader
) -> None:
    page = viewer.get("/console/nodes")
    assert page.status_code == 200 and row_ids(page.text)
    assert "data-post" not in page.text and "Drain" not in page.text
    assert "data-post" not in viewer.get("/console/keys").text
    assert "Save" not in viewer.get("/console/settings").text
    before = node_state(leader, "fs-0012")
    refused = viewer.post("/console/nodes/fs-0012/state", {"state": "drain"})
    assert refused.status_code == 403 and "viewer" in refused.json()["error"]
    assert node_state(leader, "fs-0012") == before
    row = viewer.audit("fs-0012")[0]
    assert (row["actor"], row["source"], row["status"]) == ("viewer@example.com", "web", 403)


def test_keys_page_by_id_filter_and_revoke(admin: ConsoleSite, leader: InProcessLeader) -> None:
    made = []
    for i in range(7):
        status, body = leader.admin("POST", "/api/v1/keys", {"name": f"svc-{i} {EVIL}"})
        assert status == 201, body
        made.append(body["id"])
    ordered = sorted(made)
    first = admin.get("/console/keys?size=3")
    assert first.status_code == 200
    shown = re.findall(r"<code>(k_[0-9a-f]+)</code>", first.text)
    assert shown == ordered[:3] and EVIL not in first.text and "&lt;script&gt;" in first.text
    later = re.search(r'href="([^"]+)"[^>]*rel="next"', first.text)
    assert later is not None
    second = admin.get(later.group(1).replace("&amp;", "&"))
    assert re.findall(r"<code>(k_[0-9a-f]+)</code>", second.text) == ordered[3:6]
    one = admin.get(f"/console/keys?q={ordered[4][:12].upper()}")
    assert re.findall(r"<code>(k_[0-9a-f]+)</code>", one.text) == [ordered[4]]
    revoked = admin.post(f"/console/keys/{ordered[4]}/revoke", {})
    assert revoked.status_code == 200, revoked.text
    assert leader.admin("GET", f"/api/v1/keys/{ordered[4]}")[1]["state"] == "revoked"
    only = admin.get("/console/keys?state=revoked")
    assert re.findall(r"<code>(k_[0-9a-f]+)</code>", only.text) == [ordered[4]]
    row = admin.audit(ordered[4])[0]
    assert (row["action"], row["source"], row["target"]) == ("DELETE /api/v1/keys/{id}", "web", f"key:{ordered[4]}")


def test_usage_chart_is_inline_svg_and_csv_downloads(admin: ConsoleSite) -> None:
    page = admin.get("/console/usage?days=7&metric=cost")
    assert page.status_code == 200
    assert "<svg" in page.text and page.text.count('class="bar"><title>') == 7
    assert "Spend (USD) per day, last 7 days" in page.text
    csv = admin.get("/console/usage.csv?days=7&by=model")
    assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv")
    assert csv.text.splitlines()[0] == "Period,Model,Requests,Errors,Limited,Prompt,Completion,CostMicros"
    assert admin.get("/console/usage?metric=joy").status_code == 400


def test_audit_pages_and_filters(admin: ConsoleSite) -> None:
    for i in range(3):
        admin.post(f"/console/nodes/fs-002{i}/state", {"state": "cordon"})
    page = admin.get("/console/audit?source=web&size=2")
    assert page.status_code == 200
    assert page.text.count("<td>web</td>") == 2
    later = re.search(r'href="([^"]+)"[^>]*rel="next"', page.text)
    assert later is not None and "before=" in later.group(1)
    mine = admin.get("/console/audit?actor=nobody-at-all")
    assert "No event matches." in mine.text


def test_settings_checked_diffed_saved_stale_refused_and_rolled_back(admin: ConsoleSite) -> None:
    page = admin.get("/console/settings")
    assert page.status_code == 200 and 'name="base" value="0"' in page.text
    bad = admin.post("/console/settings/check", {"base": "0", "body": "prices: 7\n"})
    assert bad.status_code == 400 and "body:" in bad.json()["error"]
    body = "retention:\n  requests_days: 30\n"
    checked = admin.post("/console/settings/check", {"base": "0", "body": body})
    assert checked.status_code == 200, checked.text
    assert ["add", "+retention:"] in checked.json()["diff"]
    saved = admin.post("/console/settings", {"base": "0", "body": body, "note": "keep a month"})
    assert saved.status_code == 200 and saved.json()["version"] == 1
    stale = admin.post("/console/settings", {"base": "0", "body": "retention:\n  requests_days: 9\n"})
    assert stale.status_code == 409
    assert "requests_days: 30" in admin.get("/console/settings").text
    again = admin.post("/console/settings", {"base": "1", "body": ""})
    assert again.status_code == 200 and again.json()["version"] == 2
    back = admin.post("/console/settings/rollback", {"version": "1"})
    assert back.status_code == 200 and back.json()["version"] == 3
    history = admin.get("/console/settings").text
    assert "rollback to version 1" in history and "requests_days: 30" in history
    row = admin.audit("settings")[0]
    assert row["source"] == "web" and row["action"] == "POST /api/v1/settings/rollback"


def test_models_page_and_a_model_that_is_not_there(admin: ConsoleSite) -> None:
    page = admin.get("/console/models")
    assert page.status_code == 200 and "Presets" in page.text
    missing = admin.get("/console/models/no-such-model")
    assert missing.status_code == 404 and "no-such-model" in missing.text


def test_the_script_and_style_sheet_are_served_from_the_package(admin: ConsoleSite) -> None:
    script = admin.get("/console/static/console.js")
    assert script.status_code == 200 and "EventSource" in script.text and "X-CSRF-Token" in script.text
    sheet = admin.get("/console/static/console.css")
    assert sheet.status_code == 200 and "prefers-color-scheme: dark" in sheet.text


def test_a_model_scaled_from_its_page(admin: ConsoleSite, leader: InProcessLeader, tmp_path: Path) -> None:
    status, body = leader.admin(
        "POST", "/api/v1/models", {"name": "tiny", "profiles": [{"engine": "sim"}], "scaling": {"min": 0, "max": 1}}
    )
    assert status == 200, body
    page = admin.get("/console/models/tiny")
    assert page.status_code == 200 and 'data-stream="/console/models/tiny/replicas"' in page.text
    scaled = admin.post("/console/models/tiny/scale", {"min": "0", "max": "3"})
    assert scaled.status_code == 200, scaled.text
    assert leader.admin("GET", "/api/v1/models/tiny")[1]["scaling"]["max"] == 3
    wrong = admin.post("/console/models/tiny/scale", {"min": "many"})
    assert wrong.status_code == 400 and wrong.json()["error"].startswith("min:")
