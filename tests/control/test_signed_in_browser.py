"""People in Debian's Chromium with real sessions, on one leader's own listeners: signing up and in (landing on the
portal or the console by role), sign-up refused while closed, an operator scaling a model, a viewer refused a change,
and a settings edit on a stale base refused while a fresh one is applied.

Each flow writes screenshots of the pages it visits to the test's output folder (``OPOD_CONSOLE_SCREENSHOTS`` names
another; the README's come from ``docs/screenshots/``). Skipped with a message where Chromium or Playwright is
missing; ``.ci/run`` installs both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.control.signin_support import PASSWORD, account, put_settings
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.site import browser_fixture, needs_chromium, shots, sign_in

MODEL = "tiny"
SCALE_CALL = "POST /api/v1/models/{name}/scale"
WIDE = {"viewport": {"width": 1280, "height": 820}, "color_scheme": "light"}

needs_chromium()


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    running = Leader(tmp_path_factory.mktemp("signed-in-browser") / "leader")
    try:
        model = {"name": MODEL, "profiles": [{"engine": "sim"}], "scaling": {"min": 0, "max": 1}}
        status, body = running.admin("POST", "/api/v1/models", model)
        assert status == 200, body
        yield running
    finally:
        running.stop()


browser = browser_fixture()


def _shot(page: Any, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(shots(tmp_path) / f"{name}.png"))


def _audit(leader: Leader, actor: str, action: str) -> list[dict[str, Any]]:
    status, rows = leader.admin("GET", f"/api/v1/audit?actor={actor}&limit=200")
    assert status == 200, rows
    return [row for row in rows if row["action"] == action]


def _people(leader: Leader, email: str) -> list[dict[str, Any]]:
    status, rows = leader.admin("GET", "/api/v1/users?limit=1000")
    assert status == 200, rows
    return [row for row in rows if row["email"] == email]


def test_a_person_signs_up_lands_on_the_portal_signs_out_and_signs_in_again(
    leader: Leader, browser: Any, tmp_path: Path
) -> None:
    put_settings(leader, "auth:\n  signup_open: true\n")
    context = browser.new_context(**WIDE)
    page = context.new_page()
    page.goto(f"{leader.url}/signin")
    _shot(page, tmp_path, "signin")
    page.get_by_role("link", name="Make one").click()
    page.get_by_label("Email").fill("sue@example.com")
    page.get_by_label("Name").fill("Sue")
    page.get_by_label("Password").fill(PASSWORD)
    _shot(page, tmp_path, "signup")
    with page.expect_navigation():
        page.get_by_role("button", name="Make the account").click()
    assert page.url == f"{leader.url}/portal"
    assert "Sue" in page.locator("header").inner_text()
    _shot(page, tmp_path, "portal-after-signup")
    (made,) = _audit(leader, "sue@example.com", "POST /signup")
    assert (made["status"], made["source"]) == (201, "web")

    with page.expect_navigation():
        page.get_by_role("button", name="Sign out").click()
    assert page.url == f"{leader.url}/signin" and page.get_by_role("button", name="Sign in").is_visible()
    page.goto(f"{leader.url}/portal/keys")  # signed out: sent to sign in, then back to the page asked for
    assert "/signin?next=" in page.url
    page.get_by_label("Email").fill("sue@example.com")
    page.get_by_label("Password").fill(PASSWORD)
    with page.expect_navigation():
        page.get_by_role("button", name="Sign in").click()
    assert page.url == f"{leader.url}/portal/keys"
    context.close()

    # On the admin listener the same person, who holds no role, has no console to land on: the page says why.
    context = browser.new_context(**WIDE)
    page = context.new_page()
    sign_in(page, leader.admin_url, "sue@example.com", PASSWORD)
    assert page.url == f"{leader.admin_url}/signin"
    assert "the console is for people with a role" in page.locator("main").inner_text()
    shown = page.goto(f"{leader.admin_url}/console/settings")
    assert shown is not None and shown.status == 403
    assert "Sue holds no role here" in page.get_by_role("alert").inner_text()
    context.close()


def test_sign_up_closed_is_refused_with_a_clear_page_and_makes_nobody(
    leader: Leader, browser: Any, tmp_path: Path
) -> None:
    put_settings(leader, "auth:\n  signup_open: true\n")
    page = browser.new_page(**WIDE)
    page.goto(f"{leader.url}/signup")
    page.get_by_label("Email").fill("tom@example.com")
    page.get_by_label("Password").fill(PASSWORD)
    put_settings(leader, "auth:\n  signup_open: false\n")  # closed while the form was open
    with page.expect_navigation():
        page.get_by_role("button", name="Make the account").click()
    alert = page.get_by_role("alert")
    assert "sign-up is closed" in alert.inner_text() and "an administrator makes accounts here" in alert.inner_text()
    assert page.get_by_role("button", name="Make the account").count() == 0
    _shot(page, tmp_path, "signup-closed")
    assert _people(leader, "tom@example.com") == []
    (refused,) = _audit(leader, "tom@example.com", "POST /signup")
    assert (refused["status"], refused["source"]) == (403, "web")

    page.goto(f"{leader.url}/signin")
    assert page.get_by_role("link", name="Make one").count() == 0
    page.goto(f"{leader.url}/signup")
    assert "Accounts here are made by an administrator." in page.locator("main").inner_text()
    page.close()


def test_an_operator_signs_in_to_the_console_and_scales_a_model(leader: Leader, browser: Any, tmp_path: Path) -> None:
    account(leader, "opal@example.com", "operator")
    page = browser.new_page(**WIDE)
    sign_in(page, leader.admin_url, "opal@example.com", PASSWORD)
    assert page.url == f"{leader.admin_url}/console"
    page.get_by_role("link", name="Models").click()
    page.get_by_role("link", name=MODEL, exact=True).click()
    assert page.locator("#scale").inner_text() == "0 to 1 replicas"
    page.get_by_label("Maximum").fill("3")
    page.get_by_role("button", name="Scale").click()
    page.wait_for_function("document.getElementById('status').textContent.includes('tiny scales from 0 to 3')")
    page.wait_for_function("document.getElementById('scale').textContent === '0 to 3 replicas'")
    _shot(page, tmp_path, "console-model-scaled")

    status, model = leader.admin("GET", f"/api/v1/models/{MODEL}")
    assert status == 200 and (model["scaling"].get("min", 0), model["scaling"]["max"]) == (0, 3), model
    (row,) = _audit(leader, "opal@example.com", SCALE_CALL)
    assert (row["status"], row["source"], row["target"]) == (200, "web", f"model:{MODEL}")
    page.get_by_role("link", name="All models").click()
    assert "0–3" in page.locator("#rows").inner_text()
    page.close()


def test_a_viewer_is_refused_a_change_on_the_page(leader: Leader, browser: Any, tmp_path: Path) -> None:
    # A viewer's pages offer no change.
    account(leader, "vic@example.com", "viewer")
    page = browser.new_page(**WIDE)
    sign_in(page, leader.admin_url, "vic@example.com", PASSWORD)
    assert page.url == f"{leader.admin_url}/console"
    page.goto(f"{leader.admin_url}/console/models/{MODEL}")
    assert page.get_by_role("button", name="Scale").count() == 0
    page.goto(f"{leader.admin_url}/console/settings")
    assert page.get_by_label("Settings (YAML").get_attribute("readonly") is not None
    assert page.get_by_role("button", name="Save").count() == 0
    page.close()

    # An operator made a viewer while their page is open: the change they then try is refused on the page.
    who = account(leader, "otto@example.com", "operator")
    page = browser.new_page(**WIDE)
    sign_in(page, leader.admin_url, "otto@example.com", PASSWORD)
    page.goto(f"{leader.admin_url}/console/models/{MODEL}")
    before = page.locator("#scale").inner_text()
    status, body = leader.admin("PUT", f"/api/v1/accounts/{who}", {"role": "viewer"})
    assert status == 200, body
    page.get_by_label("Maximum").fill("7")
    page.get_by_role("button", name="Scale").click()
    status_line = page.locator("#status.error")
    status_line.wait_for()
    assert "(viewer) may not do this: it needs the operate right" in status_line.inner_text()
    _shot(page, tmp_path, "console-viewer-refused")
    page.reload()
    assert page.locator("#scale").inner_text() == before
    assert page.get_by_role("button", name="Scale").count() == 0
    (row,) = _audit(leader, "otto@example.com", SCALE_CALL)
    assert (row["status"], row["source"]) == (403, "web")
    page.close()


def test_a_settings_edit_on_a_stale_base_is_refused_and_a_fresh_one_applied(
    leader: Leader, browser: Any, tmp_path: Path
) -> None:
    account(leader, "ada@example.com", "admin")
    context = browser.new_context(**WIDE)
    first, second = context.new_page(), context.new_page()
    sign_in(first, leader.admin_url, "ada@example.com", PASSWORD)
    base = leader.admin("GET", "/api/v1/settings")[1]["version"]
    for page in (first, second):  # two tabs open on the same version
        page.goto(f"{leader.admin_url}/console/settings")
        assert f"Version {base} is the newest" in page.locator("main").inner_text()
    body = first.get_by_label("Settings (YAML").input_value()

    first.get_by_label("Settings (YAML").fill(body + "retention:\n  requests_days: 9\n")
    with first.expect_navigation():
        first.get_by_role("button", name="Save").click()
    assert f"Version {base + 1} is the newest" in first.locator("main").inner_text()

    second.get_by_label("Settings (YAML").fill(body + "prices:\n  tiny:\n    input_per_million: 0.5\n")
    second.get_by_role("button", name="Save").click()
    refusal = second.locator("#status.error")
    refusal.wait_for()
    said = refusal.inner_text()
    assert f"version {base + 1} was saved by ada@example.com after this page read version {base}" in said
    assert "Nothing was changed" in said
    _shot(second, tmp_path, "console-settings-stale")
    newest = leader.admin("GET", "/api/v1/settings")[1]
    assert newest["version"] == base + 1 and "prices" not in newest["body"] and "requests_days: 9" in newest["body"]

    second.reload()
    fresh = second.get_by_label("Settings (YAML").input_value()
    assert "requests_days: 9" in fresh
    second.get_by_label("Settings (YAML").fill(fresh + "prices:\n  tiny:\n    input_per_million: 0.5\n")
    second.get_by_role("button", name="Check and show the diff").click()
    second.wait_for_function("document.getElementById('diff').textContent.includes('+    input_per_million: 0.5')")
    with second.expect_navigation():
        second.get_by_role("button", name="Save").click()
    assert f"Version {base + 2} is the newest" in second.locator("main").inner_text()
    newest = leader.admin("GET", "/api/v1/settings")[1]
    assert newest["version"] == base + 2 and "input_per_million: 0.5" in newest["body"]
    assert "requests_days: 9" in newest["body"], "the first edit is kept"
    rows = _audit(leader, "ada@example.com", "PUT /api/v1/settings")
    assert sorted((r["status"], r["source"]) for r in rows) == [(200, "web"), (200, "web"), (409, "web")]
    context.close()
