"""The console in Debian's Chromium (Playwright's Python package, pointed at /usr/bin/chromium): pages load with their
rows, paging swaps the rows in place, a drain is posted with the session's token, and a model's replicas stream in.

Screenshots of each page go to the test's output folder; ``OPOD_CONSOLE_SCREENSHOTS`` names another (the README's
come from ``docs/screenshots/``). Skipped with a message where Chromium or Playwright is missing; ``.ci/run``
installs both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.console import ConsoleSite, stored_nodes
from tests.support.inprocess import InProcessLeader
from tests.support.site import FixedViewer, browser_fixture, needs_chromium, person, shots

PAGES = ("", "/nodes", "/models", "/keys", "/usage", "/audit", "/settings")

needs_chromium()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ConsoleSite, str]]:
    home = tmp_path_factory.mktemp("browser") / "home"
    stored_nodes(home, 120)
    leader = InProcessLeader(home)
    status, body = leader.admin(
        "POST", "/api/v1/models", {"name": "tiny", "profiles": [{"engine": "sim"}], "scaling": {"min": 0, "max": 1}}
    )
    assert status == 200, body
    for i in range(30):
        leader.admin("POST", "/api/v1/keys", {"name": f"service {i}"})
    console = ConsoleSite(leader, FixedViewer(person("admin")))
    url = console.serve()
    yield console, url
    console.close()
    leader.stop()


browser = browser_fixture()


def test_pages_load_page_and_drain_in_chromium(site: tuple[ConsoleSite, str], browser, tmp_path: Path) -> None:
    console, url = site
    folder = shots(tmp_path)
    page = browser.new_page(viewport={"width": 1280, "height": 820}, color_scheme="light")
    page.goto(f"{url}/console/nodes?size=25")
    rows = page.locator("#rows tbody tr")
    assert rows.count() == 25 and rows.first.locator("th").inner_text().startswith("fs-0000")
    page.get_by_role("link", name="Next").click()
    page.wait_for_function("document.querySelector('#rows tbody th').textContent.startsWith('fs-0025')")
    assert "page=2" in page.url
    page.get_by_role("button", name="Drain fs-0026").click()
    page.wait_for_function("document.getElementById('status').textContent.includes('fs-0026 is draining')")
    node = console.leader.leader.fleet.get("fs-0026")
    assert node is not None and node.drained
    row = console.audit("fs-0026")[0]
    assert (row["source"], row["actor"]) == ("web", "admin@example.com")
    for path in PAGES:
        page.goto(f"{url}/console{path}")
        page.wait_for_selector("main h1")
        page.screenshot(path=str(folder / f"console-{path.strip('/') or 'summary'}.png"))
    page.close()


def test_dark_theme_on_a_phone_and_replicas_streamed(site: tuple[ConsoleSite, str], browser, tmp_path: Path) -> None:
    console, url = site
    folder = shots(tmp_path)
    page = browser.new_page(viewport={"width": 390, "height": 844}, color_scheme="dark")
    page.goto(f"{url}/console/keys?size=10")
    assert page.locator("#rows tbody tr").count() == 10
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(17, 19, 24)"
    page.get_by_role("button", name="Light theme").click()
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(247, 247, 248)"
    page.get_by_role("button", name="Dark theme").click()
    page.screenshot(path=str(folder / "console-keys-phone-dark.png"))
    page.goto(f"{url}/console/models/tiny")
    # The stream's first event is the rows as they stand; each change of a replica comes the same way.
    page.wait_for_selector("#replica-rows[data-updated]", timeout=5000)
    assert "No replica now." in page.locator("#replica-rows").inner_text()
    page.close()
