"""The members' portal in Debian's Chromium (Playwright's Python package, pointed at /usr/bin/chromium): a member makes
a key on the keys page, pastes it in the playground and gets an answer streamed from a simulator worker through
``/v1`` on the same listener.

Screenshots of each page go to the test's output folder; ``OPOD_CONSOLE_SCREENSHOTS`` names another (the README's
come from ``docs/screenshots/``). Skipped with a message where Chromium or Playwright is missing; ``.ci/run``
installs both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.portal import CHAT, PortalSite, World, build_world
from tests.support.site import FixedViewer, browser_fixture, needs_chromium, shots

PAGES = ("", "/keys", "/usage")

needs_chromium()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, PortalSite, str]]:
    world = build_world(tmp_path_factory.mktemp("portal-browser"))
    portal = PortalSite(world.leader, FixedViewer(world.viewer("ada")))
    try:
        yield world, portal, portal.serve()
    finally:
        portal.close()
        world.stop()


browser = browser_fixture()


def test_a_member_makes_a_key_and_gets_a_streamed_answer_in_the_playground(
    site: tuple[World, PortalSite, str], browser, tmp_path: Path
) -> None:
    world, _, url = site
    folder = shots(tmp_path)
    page = browser.new_page(viewport={"width": 1280, "height": 820}, color_scheme="light")
    page.goto(f"{url}/portal/keys")
    page.get_by_label("Name").fill("playground key")
    page.get_by_role("button", name="Make key").click()
    page.wait_for_selector("#secret:not([hidden])")
    secret = page.locator("#secret code").inner_text().strip()
    assert secret.startswith("sk-")
    page.wait_for_function("document.querySelector('#rows').textContent.includes('playground key')")

    page.goto(f"{url}/portal/playground?model={CHAT}")
    page.locator("#pg-key").fill(secret)
    page.get_by_role("button", name="Send").click()
    page.wait_for_selector("#pg-answer[data-done]", timeout=30_000)
    assert page.locator("#pg-answer").inner_text().strip()
    assert int(page.locator("#pg-answer").get_attribute("data-chunks") or "0") > 1  # streamed, piece by piece
    assert "streamed pieces" in page.locator("#status").inner_text()
    page.get_by_role("button", name="Embed").click()
    page.wait_for_function("document.getElementById('pg-vector').textContent.includes('dimensions')")
    # A wrong key is refused by /v1 and the page says so.
    page.locator("#pg-key").fill("sk-not-a-key")
    page.get_by_role("button", name="Send").click()
    page.wait_for_function("document.getElementById('status').textContent.startsWith('Refused: 401')")
    page.locator("#pg-key").fill(secret)
    page.get_by_role("button", name="Send").click()
    page.wait_for_selector("#pg-answer[data-done]", timeout=30_000)
    page.screenshot(path=str(folder / "portal-playground.png"))  # with its answer
    for path in PAGES:
        page.goto(f"{url}/portal{path}")
        page.wait_for_selector("main h1")
        page.screenshot(path=str(folder / f"portal-{path.strip('/') or 'models'}.png"))
    page.close()


def test_the_playground_on_a_phone_in_the_dark(site: tuple[World, PortalSite, str], browser, tmp_path: Path) -> None:
    _, _, url = site
    page = browser.new_page(viewport={"width": 390, "height": 844}, color_scheme="dark")
    page.goto(f"{url}/portal/playground")
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(17, 19, 24)"
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390 + 1, f"the page is {width}px wide on a 390px screen"
    page.screenshot(path=str(shots(tmp_path) / "portal-playground-phone-dark.png"))
    page.close()
