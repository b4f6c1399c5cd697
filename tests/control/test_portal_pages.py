"""The members' portal on the public listener, seen by a fixed person (sessions are the sign-in area's).

Each page shows a member what is theirs and nothing else: the models served less those kept for a
team they are not in, their own keys in their projects, their own and their projects' usage. A key
made on the portal answers on ``/v1`` and is refused there once revoked on it; a key or project of
someone else's is refused 403, audited ``source: web`` with the person as actor, and nothing changes.
"""

from __future__ import annotations

import contextlib
import html
import io
import re
import time
from collections.abc import Iterator

import httpx
import pytest

from opod.control.console.kit import FRAGMENT_HEADER
from tests.support.portal import CHAT, EMBED, KEPT, PortalSite, World, build_world
from tests.support.site import FixedViewer


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    built = build_world(tmp_path_factory.mktemp("portal"))
    yield built
    built.stop()


@pytest.fixture
def ada(world: World) -> Iterator[PortalSite]:
    site = PortalSite(world.leader, FixedViewer(world.viewer("ada")))
    yield site
    site.close()


@pytest.fixture
def bob(world: World) -> Iterator[PortalSite]:
    site = PortalSite(world.leader, FixedViewer(world.viewer("bob")))
    yield site
    site.close()


def chat(world: World, key: str) -> httpx.Response:
    body = {"model": CHAT, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
    return httpx.post(
        f"{world.leader.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def audit(world: World, contains: str) -> list[dict[str, object]]:
    status, rows = world.leader.admin("GET", f"/api/v1/audit?contains={contains}")
    assert status == 200, rows
    return list(rows)


def make_key(site: PortalSite, project: str, name: str) -> dict[str, str]:
    answer = site.post("/portal/keys", {"name": name, "project": project})
    assert answer.status_code == 200, answer.text
    assert answer.headers["cache-control"] == "no-store"
    return dict(answer.json())


def text_of(page: str, element_id: str) -> str:
    """The text a reader sees in the element with ``element_id`` (its tags taken out)."""
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</pre>', page, re.S)
    assert found, element_id
    return html.unescape(re.sub(r"<[^>]+>", "", found.group(1)))


def test_nobody_signed_in_is_sent_to_sign_in_and_a_change_is_refused(world: World) -> None:
    site = PortalSite(world.leader, FixedViewer(None))
    try:
        answer = site.get("/portal/keys?state=active")
        assert answer.status_code == 303
        assert answer.headers["location"] == "/signin?next=%2Fportal%2Fkeys%3Fstate%3Dactive"
        refused = site.post("/portal/keys", {"name": "x", "project": world.ids["acme/ml/chat"]}, csrf="")
        assert refused.status_code == 401 and "not signed in" in refused.json()["error"]
    finally:
        site.close()


def test_the_models_page_lists_what_is_served_less_what_is_kept_for_another_team(
    ada: PortalSite, bob: PortalSite
) -> None:
    page = ada.get("/portal")
    assert page.status_code == 200
    assert f"<code>{CHAT}</code>" in page.text and f"<code>{EMBED}</code>" in page.text
    assert KEPT not in page.text
    assert 'aria-current="page"' in page.text and "/portal/static/console.css" in page.text
    theirs = bob.get("/portal").text
    assert f"<code>{KEPT}</code>" in theirs and "acme / ops" in theirs


def test_a_key_made_on_the_portal_answers_on_v1_and_once_revoked_is_refused(world: World, ada: PortalSite) -> None:
    made = make_key(ada, world.ids["acme/ml/chat"], "laptop")
    secret, key_id = made["secret"], made["id"]
    assert secret.startswith("sk-") and "shown this once" in made["message"]
    rows = ada.get("/portal/keys", headers={FRAGMENT_HEADER: "rows"}).text
    assert key_id in rows and "acme/ml/chat" in rows and secret not in rows
    assert chat(world, secret).status_code == 200
    row = audit(world, key_id)[0]
    assert (row["action"], row["source"], row["actor"], row["status"]) == (
        "POST /api/v1/keys",
        "web",
        "ada@example.com",
        201,
    )
    revoked = ada.post(f"/portal/keys/{key_id}/revoke", {})
    assert revoked.status_code == 200, revoked.text
    assert chat(world, secret).status_code == 401
    assert "state-revoked" in ada.get("/portal/keys?state=revoked").text
    row = audit(world, key_id)[0]
    assert (row["action"], row["source"], row["actor"]) == ("DELETE /api/v1/keys/{id}", "web", "ada@example.com")


def test_another_projects_key_and_project_are_refused_403_audited_and_nothing_changes(
    world: World, ada: PortalSite, bob: PortalSite
) -> None:
    theirs = make_key(bob, world.ids["acme/ops/batch"], "bob's")
    refused = ada.post(f"/portal/keys/{theirs['id']}/revoke", {})
    assert refused.status_code == 403 and "not in one of your projects" in refused.json()["error"]
    assert chat(world, theirs["secret"]).status_code == 200  # still works
    row = audit(world, theirs["id"])[0]
    assert (row["action"], row["source"], row["actor"], row["status"]) == (
        "DELETE /api/v1/keys/{id}",
        "web",
        "ada@example.com",
        403,
    )
    before = world.leader.admin("GET", f"/api/v1/keys?project={world.ids['acme/ops/batch']}")[1]
    made = ada.post("/portal/keys", {"name": "sneaky", "project": world.ids["acme/ops/batch"]})
    assert made.status_code == 403 and "not one of your projects" in made.json()["error"]
    assert world.leader.admin("GET", f"/api/v1/keys?project={world.ids['acme/ops/batch']}")[1] == before
    assert any(r["actor"] == "ada@example.com" and r["status"] == 403 for r in audit(world, "POST /api/v1/keys"))
    listing = ada.get(f"/portal/keys?project={world.ids['acme/ops/batch']}")
    assert listing.status_code == 403 and theirs["id"] not in listing.text
    assert theirs["id"] not in ada.get("/portal/keys").text


def test_a_change_without_the_sessions_csrf_token_is_refused(world: World, ada: PortalSite) -> None:
    before = ada.get("/portal/keys").text.count('<th scope="row">')
    for token in (None, "forged"):
        refused = ada.post("/portal/keys", {"name": "no token", "project": world.ids["acme/ml/chat"]}, csrf=token)
        assert refused.status_code == 403 and "X-CSRF-Token" in refused.json()["error"]
    assert ada.get("/portal/keys").text.count('<th scope="row">') == before
    assert "no token" not in ada.get("/portal/keys").text


def test_keys_page_on_the_server_a_page_at_a_time(world: World, bob: PortalSite) -> None:
    for i in range(4):
        make_key(bob, "acme/ops/batch", f"page {i}")
    first = bob.get("/portal/keys?size=2&state=active")
    assert first.status_code == 200 and first.text.count('<th scope="row"><code>k_') == 2
    later = re.search(r'href="([^"]+)" data-swap="rows" rel="next"', first.text)
    assert later is not None
    second = bob.get(html.unescape(later.group(1)), headers={FRAGMENT_HEADER: "rows"})
    assert second.status_code == 200 and "<html" not in second.text
    assert second.text.count('<th scope="row"><code>k_') == 2


def test_usage_shows_ones_own_and_ones_projects_against_their_budget(world: World, ada: PortalSite) -> None:
    status, current = world.leader.admin("GET", "/api/v1/settings")
    assert status == 200, current
    body = (
        f"prices:\n  {CHAT}: {{input_per_million: 1000, output_per_million: 1000}}\n"
        f"budgets:\n  - scope: project:acme/ml/chat\n    period: month\n    micros: 25000000\n"
    )
    status, saved = world.leader.admin("PUT", "/api/v1/settings", {"base": current.get("version", 0), "body": body})
    assert status == 200, saved
    secret = make_key(ada, "acme/ml/chat", "usage")["secret"]
    assert chat(world, secret).status_code == 200
    spend = re.compile(r'id="mine-spend">Your spend</h2><p class="big">\$([0-9.,]+)<')
    for _ in range(100):  # the ledger writes its rows in batches: this priced request's comes a moment later
        page = ada.get("/portal/usage?metric=requests&days=7")
        mine = spend.search(page.text)
        if mine is not None and float(mine.group(1)) > 0:
            break
        time.sleep(0.05)
    assert page.status_code == 200
    assert "<svg" in page.text and "Your requests per day, last 7 days" in page.text
    assert "acme/ml/chat" in page.text and "acme/ops/batch" not in page.text
    assert "of $25.00" in page.text and "this month" in page.text and 'class="big">0<' not in page.text
    assert mine is not None and float(mine.group(1)) > 0


def test_the_playground_has_its_script_and_snippets_naming_this_address_and_the_model(
    world: World, ada: PortalSite
) -> None:
    page = ada.get(f"/portal/playground?model={CHAT}")
    assert page.status_code == 200
    assert '<script src="/portal/static/playground.js" defer></script>' in page.text
    assert 'id="pg-key" type="password" autocomplete="off"' in page.text
    script = ada.get("/portal/static/playground.js")
    assert script.status_code == 200 and "getReader()" in script.text and "/chat/completions" in script.text
    base = f"http://127.0.0.1:{world.leader.port}/v1"
    assert text_of(page.text, "snippet-python-chat") == (
        "from openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{base}", api_key="YOUR_API_KEY")\n'
        "stream = client.chat.completions.create(\n"
        f'    model="{CHAT}",\n'
        '    messages=[{"role": "user", "content": "Hello"}],\n'
        "    stream=True,\n"
        ")\n"
        "for chunk in stream:\n"
        "    if chunk.choices:\n"
        '        print(chunk.choices[0].delta.content or "", end="", flush=True)\n'
        "print()"
    )
    assert text_of(page.text, "snippet-curl-chat") == (
        f"curl {base}/chat/completions \\\n"
        '  -H "Authorization: Bearer YOUR_API_KEY" \\\n'
        '  -H "Content-Type: application/json" \\\n'
        f'  -d \'{{"model": "{CHAT}", "messages": [{{"role": "user", "content": "Hello"}}]}}\''
    )
    embedding = ada.get(f"/portal/playground?model={EMBED}").text
    assert f'"model": "{EMBED}", "input": "Hello"' in text_of(embedding, "snippet-curl-embed")
    assert f'model="{CHAT}"' in text_of(embedding, "snippet-python-chat")  # the first chat model
    assert KEPT not in page.text


def test_the_snippets_run_as_written_against_v1(world: World, ada: PortalSite) -> None:
    """The Python snippet, with a real key put where it says, streams an answer through the ``openai`` package."""
    page = ada.get(f"/portal/playground?model={CHAT}")
    secret = make_key(ada, "acme/ml/chat", "snippet")["secret"]
    code = text_of(page.text, "snippet-python-chat").replace("YOUR_API_KEY", secret)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "snippet", "exec"), {})
    assert printed.getvalue().strip()
