"""Sign-in on a real leader over real HTTP: accounts, sign-up open and closed, one answer for every wrong sign-in,
the throttle per account and per address, the cookie's flags, sign-out, expiry, CSRF, and the audit of each."""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime

import httpx
import pytest

from tests.control.signin_support import PASSWORD, account, audit_rows, browser, put_settings, signed_in
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.opod_process import OPOD, wait_until

WRONG = {"error": "wrong email or password; check both and try again"}


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    running = Leader(tmp_path_factory.mktemp("signin") / "leader")
    try:
        yield running
    finally:
        running.stop()


def test_sign_up_is_closed_by_default_and_opens_by_the_settings(leader: Leader) -> None:
    with browser(leader, public=True) as web:
        closed = web.post("/signup", json={"email": "sam@example.com", "password": PASSWORD})
        assert closed.status_code == 403 and "sign-up is closed" in closed.json()["error"], closed.text
        assert "Accounts here are made by an administrator" in web.get("/signup").text
        assert leader.admin("GET", "/api/v1/users/sam@example.com")[0] == 404

        put_settings(leader, "auth:\n  signup_open: true\n  base_url: https://llm.example.com\n")
        assert leader.admin("GET", "/api/v1/auth")[1]["signup_open"] is True
        short = web.post("/signup", json={"email": "sam@example.com", "password": "short"})
        assert short.status_code == 400 and "password: a password has at least 10" in short.json()["error"]
        made = web.post("/signup", json={"email": "sam@example.com", "name": "Sam", "password": PASSWORD})
        assert made.status_code == 201, made.text
        assert made.json()["email"] == "sam@example.com" and made.json()["role"] == ""
        assert web.get("/whoami").json()["email"] == "sam@example.com"  # signed in by the sign-up
        again = web.post("/signup", json={"email": "SAM@example.com", "password": PASSWORD})
        assert again.status_code == 409 and "has an account already" in again.json()["error"]
    status, auth = leader.admin("GET", "/api/v1/auth")
    assert (auth["signup_open"], auth["base_url"]) == (True, "https://llm.example.com")
    assert [(r["action"], r["source"], r["status"]) for r in audit_rows(leader, "sam@example.com")][-1] == (
        "POST /signup",
        "web",
        201,
    )
    put_settings(leader, "")


def test_a_wrong_password_and_an_unknown_account_get_one_answer_and_an_empty_password_is_refused_first(
    leader: Leader,
) -> None:
    account(leader, "ann@example.com", "viewer")
    with browser(leader, address="127.0.0.5") as web:
        wrong = web.post("/signin", json={"username": "ann@example.com", "password": "not her password"})
        unknown = web.post("/signin", json={"username": "nobody@example.com", "password": "not her password"})
        assert (wrong.status_code, wrong.json()) == (unknown.status_code, unknown.json()) == (401, WRONG)
        assert "set-cookie" not in wrong.headers and "set-cookie" not in unknown.headers
        empty = web.post("/signin", json={"username": "ann@example.com", "password": ""})
        assert empty.status_code == 400 and empty.json() == {"error": "password: empty; send your password"}
        right = web.post("/signin", json={"username": "ANN@example.com", "password": PASSWORD})
        assert right.status_code == 200 and right.json()["role"] == "viewer"
    rows = [(r["action"], r["status"], r["source"]) for r in audit_rows(leader, "ann@example.com")]
    assert rows[-3:] == [("POST /signin", 401, "web"), ("POST /signin", 400, "web"), ("POST /signin", 200, "web")]
    assert [(r["status"], r["source"]) for r in audit_rows(leader, "nobody@example.com")] == [(401, "web")]
    assert all("not her password" not in str(r) for r in audit_rows(leader, "ann@example.com"))


def test_an_unknown_account_takes_about_as_long_to_refuse_as_a_wrong_password(leader: Leader) -> None:
    account(leader, "tim@example.com")

    def took(username: str) -> float:
        with browser(leader, address="127.0.0.6") as web:
            start = time.perf_counter()
            assert web.post("/signin", json={"username": username, "password": "a wrong one"}).status_code == 401
            return time.perf_counter() - start

    wrong = statistics.median(took("tim@example.com") for _ in range(3))
    unknown = statistics.median(took(f"ghost{i}@example.com") for i in range(3))
    assert unknown > wrong / 2, (unknown, wrong)  # the hash of nothing is checked too: no quick "no such account"


def test_failed_sign_ins_are_throttled_per_account_even_with_the_right_password(leader: Leader) -> None:
    account(leader, "kim@example.com")
    with browser(leader, public=True, address="127.0.0.7") as web:
        for _ in range(5):
            assert (
                web.post("/signin", json={"username": "kim@example.com", "password": "guess guess"}).status_code == 401
            )
        refused = web.post("/signin", json={"username": "kim@example.com", "password": PASSWORD})
    assert refused.status_code == 429 and "too many failed sign-ins for this account" in refused.json()["error"]
    assert int(refused.headers["retry-after"]) > 0
    with browser(leader, public=True, address="127.0.0.8") as other:  # from anywhere: the account is throttled
        assert other.post("/signin", json={"username": "kim@example.com", "password": PASSWORD}).status_code == 429
    assert [r["status"] for r in audit_rows(leader, "kim@example.com")][-2:] == [429, 429]


def test_failed_sign_ins_are_throttled_per_address(leader: Leader) -> None:
    account(leader, "lee@example.com")
    with browser(leader, public=True, address="127.0.0.9") as web:
        for i in range(20):
            guess = {"username": f"guess{i}@example.com", "password": "guess guess"}
            assert web.post("/signin", json=guess).status_code == 401
        refused = web.post("/signin", json={"username": "lee@example.com", "password": PASSWORD})
        assert refused.status_code == 429 and "for this address" in refused.json()["error"]
    with browser(leader, public=True, address="127.0.0.10") as elsewhere:
        assert elsewhere.post("/signin", json={"username": "lee@example.com", "password": PASSWORD}).status_code == 200


def test_the_session_cookie_is_http_only_same_site_lax_and_secure_only_over_tls(leader: Leader) -> None:
    account(leader, "cat@example.com")
    with browser(leader) as web:
        cookie = web.post("/signin", json={"username": "cat@example.com", "password": PASSWORD}).headers["set-cookie"]
    flags = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert cookie.startswith("opod_session=") and {"httponly", "samesite", "path", "max-age"} <= flags
    assert "samesite=lax" in cookie.lower() and "secure" not in flags

    async def over_tls() -> httpx.Response:
        app = leader.up.listeners[1].app
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://127.0.0.1") as tls:
            return await tls.post("/signin", json={"username": "cat@example.com", "password": PASSWORD})

    assert "secure" in {p.strip().lower() for p in leader.call(over_tls()).headers["set-cookie"].split(";")}


def test_the_sign_in_page_signs_in_with_a_form_and_signs_out_with_its_csrf_token(leader: Leader) -> None:
    account(leader, "dan@example.com")
    with browser(leader, public=True) as web:
        assert 'name="password"' in web.get("/signin").text
        bad = web.post("/signin", data={"username": "dan@example.com", "password": "wrong password"})
        assert bad.status_code == 401 and WRONG["error"] in bad.text and 'value="dan@example.com"' in bad.text
        done = web.post("/signin", data={"username": "dan@example.com", "password": PASSWORD, "next": "/signin"})
        # The sign-in page itself is no page to land on: the public listener's home, the portal, is.
        assert done.status_code == 303 and done.headers["location"] == "/portal"
        page = web.get("/signin").text
        assert "signed in as dan@example.com" in page
        token = page.split('name="csrf_token" value="')[1].split('"')[0]
        forged = web.post("/signout", data={"csrf_token": "forged"})
        assert forged.status_code == 403 and web.get("/whoami").status_code == 200
        out = web.post("/signout", data={"csrf_token": token})
        assert out.status_code == 303 and web.get("/whoami").status_code == 401
    rows = [(r["action"], r["status"]) for r in audit_rows(leader, "dan@example.com")]
    assert rows[-2:] == [("POST /signout", 403), ("POST /signout", 200)]


def test_a_form_another_site_sent_is_refused(leader: Leader) -> None:
    with browser(leader, public=True) as web:
        answer = web.post(
            "/signin", data={"username": "x@example.com", "password": "p"}, headers={"Origin": "https://evil.test"}
        )
    assert answer.status_code == 403 and "another site" in answer.text


def test_a_disabled_person_and_a_reset_password_end_the_sessions_at_once(leader: Leader) -> None:
    eve = account(leader, "eve@example.com", "viewer")
    web, _ = signed_in(leader, "eve@example.com")
    assert web.get("/api/v1/nodes").status_code == 200
    assert leader.admin("PUT", f"/api/v1/accounts/{eve}", {"state": "disabled"})[0] == 200
    ended = web.get("/api/v1/nodes")
    assert ended.status_code == 401 and "session has ended" in ended.json()["error"]
    refused = web.post("/signin", json={"username": "eve@example.com", "password": PASSWORD})
    assert refused.status_code == 403 and "is disabled" in refused.json()["error"]
    assert leader.admin("PUT", f"/api/v1/accounts/{eve}", {"state": "active"})[0] == 200
    web, _ = signed_in(leader, "eve@example.com")
    assert leader.admin("PUT", f"/api/v1/accounts/{eve}/password", {"password": "a new password!"})[0] == 200
    assert web.get("/whoami").status_code == 401
    assert web.post("/signin", json={"username": "eve@example.com", "password": PASSWORD}).status_code == 401
    assert web.post("/signin", json={"username": "eve@example.com", "password": "a new password!"}).status_code == 200


def test_no_passwords_turns_local_sign_in_off(leader: Leader) -> None:
    account(leader, "ned@example.com")
    provider = "    issuer: https://sso.example.com\n    client_id: opod\n"  # passwords off needs a provider to sign in
    put_settings(
        leader,
        "auth:\n  signup_open: true\n  base_url: http://127.0.0.1\n  oidc:\n" + provider + "    no_passwords: true\n",
    )
    try:
        with browser(leader) as web:
            refused = web.post("/signin", json={"username": "ned@example.com", "password": PASSWORD})
            assert refused.status_code == 403 and "passwords are turned off" in refused.json()["error"]
            signup = web.post("/signup", json={"email": "new@example.com", "password": PASSWORD})
            assert signup.status_code == 403
        assert leader.admin("GET", "/api/v1/auth")[1]["signup_open"] is False
    finally:
        put_settings(leader, "")


def test_a_session_ends_when_idle_and_at_its_absolute_end(tmp_path_factory: pytest.TempPathFactory) -> None:
    short = Leader(tmp_path_factory.mktemp("expiry") / "leader")
    try:
        account(short, "ivy@example.com", "viewer")
        put_settings(short, "auth:\n  session_idle: 1s\n  session_lifetime: 4s\n")
        idle, _ = signed_in(short, "ivy@example.com")
        time.sleep(1.3)
        assert idle.get("/whoami").status_code == 401
        busy = browser(short)
        answer = busy.post("/signin", json={"username": "ivy@example.com", "password": PASSWORD})
        ends = datetime.fromisoformat(answer.json()["expires_at"]).timestamp()
        cookie = {"Cookie": f"opod_session={answer.cookies['opod_session']}"}  # the leader's clock, not the jar's
        answers = []
        while time.time() < ends + 1:  # used more often than it idles, it still ends at its absolute end
            time.sleep(0.3)
            sent = time.time() - ends
            answers.append((sent, httpx.get(short.admin_url + "/whoami", headers=cookie).status_code))
        shown = " ".join(f"{sent:.2f}:{status}" for sent, status in answers)
        assert [a for a in answers if a[0] < -0.2 and a[1] != 200] == [], shown
        assert [a for a in answers if a[0] > 0.2 and a[1] != 401] == [], shown
        assert len(answers) > 8  # some 3 s of use, more often than it idles
    finally:
        short.stop()


def test_the_first_admin_is_made_with_opod_ctl_and_signs_in(leader: Leader) -> None:
    made = subprocess.run(
        [*OPOD, "ctl", "users", "add", "root@example.com", "--role", "admin", "--password-stdin"],
        input="the first admin's password\n",
        env=leader.cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    assert "root@example.com" in made.stdout and "admin" in made.stdout
    web, csrf = signed_in(leader, "root@example.com", "the first admin's password")
    assert web.get("/whoami").json()["role"] == "admin"
    assert leader.admin("GET", "/api/v1/users/root@example.com")[1]["role"] == "admin"
    wait_until(  # the store has it at once; each leader's list of people follows it within 2 s
        lambda: "last_login_at" in leader.admin("GET", "/api/v1/users/root@example.com")[1], 10, "the sign-in's time"
    )
    mine = web.put("/api/v1/auth/secrets/scim-token", json={"value": "s" * 24}, headers={"X-CSRF-Token": csrf})
    assert mine.status_code == 200  # an admin does everything
