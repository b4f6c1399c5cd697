"""Signing in through a real OpenID provider (panva's oidc-provider under node, on loopback): the code flow with PKCE
from ``begin`` to ``complete``, the people it makes and keeps in step, and every refusal, with nothing changed.

The leader is built in the test's process (its composition root builds the sign-in once); the browser's part at the
provider is plain HTTP (:func:`tests.support.openid.sign_in_at_provider`), as the portal's pages will hand it over.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from bench.ports import free_port
from opod.access.oidc import OidcRefused, OidcSignIn
from opod.store.people import UserRecord
from tests.support.inprocess import InProcessLeader as Leader
from tests.support.openid import CLIENT_ID, CLIENT_SECRET, OpenIdProvider, require_node, sign_in_at_provider


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leader]:
    require_node()
    up = Leader(tmp_path_factory.mktemp("oidc") / "home")
    status, _ = up.admin("PUT", "/api/v1/auth/secrets/oidc-client-secret", {"value": CLIENT_SECRET})
    assert status == 200
    for path, body in [
        ("/api/v1/orgs", {"name": "acme"}),
        ("/api/v1/teams", {"name": "ml", "in": "acme"}),
        ("/api/v1/projects", {"name": "chat", "in": "acme/ml"}),
    ]:
        status, made = up.admin("POST", path, body)
        assert status == 201, made
    yield up
    up.stop()


def callback(leader: Leader) -> str:
    return f"http://127.0.0.1:{leader.port}/auth/oidc/callback"


@pytest.fixture(scope="module")
def provider(leader: Leader) -> Iterator[OpenIdProvider]:
    running = OpenIdProvider(callback(leader))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def other_provider(leader: Leader) -> Iterator[OpenIdProvider]:
    """Another issuer, with the same client and people: what a mix-up sends a browser to."""
    running = OpenIdProvider(callback(leader))
    yield running
    running.stop()


def settings(leader: Leader, issuer: str, **oidc: Any) -> None:
    """``auth.oidc`` in force, through ``PUT /api/v1/settings`` as an operator sends it."""
    lines = [f"  base_url: http://127.0.0.1:{leader.port}", "  oidc:", f"    issuer: '{issuer}'"]
    lines.append(f"    client_id: {CLIENT_ID}")
    lines.append("    scopes: [openid, email, profile, groups]")
    for key, value in oidc.items():
        lines.append(f"    {key}: {value}")
    body = "auth:\n" + "\n".join(lines) + "\n"
    status, now = leader.admin("GET", "/api/v1/settings")
    status, put = leader.admin("PUT", "/api/v1/settings", {"base": now["version"], "body": body})
    assert status == 200, put


def oidc(leader: Leader) -> OidcSignIn:
    return leader.leader.control.oidc


def sign_in(leader: Leader, account: str, return_to: str = "/", **browser: Any) -> tuple[dict[str, str], str, str]:
    """``begin``, then the browser at the provider: (the callback's params, the cookie value, the address begun)."""
    start = leader.call(oidc(leader).begin(return_to))
    params = sign_in_at_provider(start.redirect_url, account, callback(leader), **browser)
    return params, start.cookie_value, start.redirect_url


def complete(leader: Leader, params: dict[str, str], cookie: str) -> UserRecord:
    return leader.call(oidc(leader).complete(params, cookie))


def refused(leader: Leader, params: dict[str, str], cookie: str) -> str:
    with pytest.raises(OidcRefused) as caught:
        complete(leader, params, cookie)
    return caught.value.reason


def people(leader: Leader) -> list[dict[str, Any]]:
    status, users = leader.admin("GET", "/api/v1/users")
    assert status == 200
    return sorted(users, key=lambda u: u["email"])


def by_email(leader: Leader, email: str) -> dict[str, Any]:
    return next(u for u in people(leader) if u["email"] == email)


MAPPINGS = {
    "create_accounts": "true",
    "label": "Acme SSO",
    "group_roles": "{fleet-admins: admin}",
    "group_memberships": (
        "{fleet-admins: [{target: 'team:acme/ml', role: manager}], engineering: [{target: 'project:acme/ml/chat'}]}"
    ),
}


def test_the_code_flow_with_pkce_makes_the_person_with_their_groups_role_and_places(
    leader: Leader, provider: OpenIdProvider
) -> None:
    settings(leader, provider.issuer, **MAPPINGS)
    params, cookie, address = sign_in(leader, "ada", return_to="/portal/keys?page=2")
    asked = parse_qs(urlsplit(address).query)
    assert address.startswith(f"{provider.issuer}/auth?")
    assert asked["code_challenge_method"] == ["S256"] and asked["code_challenge"][0]
    assert asked["nonce"][0] and asked["state"][0] and asked["redirect_uri"] == [callback(leader)]
    assert "code_verifier" not in asked  # the verifier stays in the sealed cookie

    ada = complete(leader, params, cookie)
    assert (ada.email, ada.name, ada.role, ada.external_id) == ("ada@example.com", "Ada Lovelace", "admin", "ada")
    assert oidc(leader).return_to(cookie) == "/portal/keys?page=2"
    shown = by_email(leader, "ada@example.com")
    assert shown["last_login_at"] and shown["role"] == "admin"
    assert {(m["path"], m["role"]) for m in shown["memberships"]} == {
        ("acme/ml", "manager"),
        ("acme/ml/chat", "member"),
    }
    status, rows = leader.admin("GET", "/api/v1/audit?actor=ada@example.com")
    assert status == 200 and rows and {r["source"] for r in rows} == {"web"}

    # The same answer again: its code was spent, and the provider says so.
    assert "invalid_grant" in refused(leader, params, cookie)


def test_a_second_sign_in_follows_the_groups_and_the_account_is_found_again(
    leader: Leader, provider: OpenIdProvider
) -> None:
    settings(leader, provider.issuer, **MAPPINGS)
    bob = complete(leader, *sign_in(leader, "bob")[:2])
    status, _ = leader.admin("POST", f"/api/v1/users/{bob.id}/memberships", {"target": "team:acme/ml"})
    assert status == 200
    first = by_email(leader, "bob@example.com")["last_login_at"]

    # Bob is not in fleet-admins, which the mapping says gives acme/ml: he leaves it at his next sign-in.
    again = complete(leader, *sign_in(leader, "bob")[:2])
    assert again.id == bob.id and again.role == ""
    shown = by_email(leader, "bob@example.com")
    assert [m["path"] for m in shown["memberships"]] == ["acme/ml/chat"]
    assert shown["last_login_at"] > first


def test_groups_match_in_any_case_and_one_the_mapping_does_not_name_is_shown_granting_nothing(
    leader: Leader, provider: OpenIdProvider
) -> None:
    # The provider sends fleet-admins and engineering; the mapping names the first in other cases, the second not.
    settings(
        leader,
        provider.issuer,
        create_accounts="true",
        group_roles="{Fleet-Admins: operator}",
        group_memberships="{FLEET-ADMINS: [{target: 'project:acme/ml/chat', role: manager}]}",
    )
    ada = complete(leader, *sign_in(leader, "ada")[:2])
    assert ada.role == "operator"
    # chat follows the groups; acme/ml, which the mapping no longer names, is left as it was.
    shown = by_email(leader, "ada@example.com")
    assert {m["path"]: m["role"] for m in shown["memberships"]} == {"acme/ml": "manager", "acme/ml/chat": "manager"}
    status, rows = leader.admin("GET", "/api/v1/audit?actor=ada@example.com&limit=1000")
    assert status == 200
    placed = [str(r.get("detail", "")) for r in rows if "memberships" in str(r.get("detail", ""))]
    assert placed and "engineering" in placed[0] and "nothing: auth.oidc does not name it" in placed[0]


def test_an_unknown_person_is_refused_while_create_accounts_is_off(leader: Leader, provider: OpenIdProvider) -> None:
    settings(leader, provider.issuer, create_accounts="false")
    before = people(leader)
    reason = refused(leader, *sign_in(leader, "carol")[:2])
    assert "no account for carol@example.com" in reason and "create_accounts is off" in reason
    assert people(leader) == before


def test_a_forged_or_crossed_answer_is_refused_and_changes_nobody(leader: Leader, provider: OpenIdProvider) -> None:
    settings(leader, provider.issuer, create_accounts="true")
    before = people(leader)
    carols, _, _ = sign_in(leader, "carol")
    _, mine, _ = sign_in(leader, "carol")
    assert "state is not this browser's sign-in" in refused(leader, carols, mine)
    assert "state is not this browser's sign-in" in refused(leader, {**carols, "state": ""}, mine)
    assert "started no sign-in here" in refused(leader, carols, "")
    assert "cookie is altered" in refused(leader, carols, mine[:-4] + "AAAA")

    # The nonce sent to the provider changed on the way: the ID token carries another.
    params, cookie, _ = sign_in(leader, "carol", edit={"nonce": "someone-elses-nonce"})
    assert "nonce is not this sign-in's" in refused(leader, params, cookie)
    assert people(leader) == before


def test_the_providers_own_refusal_is_passed_on(leader: Leader, provider: OpenIdProvider) -> None:
    settings(leader, provider.issuer, create_accounts="true")
    before = people(leader)
    params, cookie, _ = sign_in(leader, "carol", abort=True)
    assert params["error"] == "access_denied"
    assert (
        refused(leader, params, cookie)
        == "the provider refused the sign-in: access_denied: End-User aborted interaction"
    )
    assert people(leader) == before


def test_an_answer_or_a_token_from_another_issuer_is_refused(
    leader: Leader, provider: OpenIdProvider, other_provider: OpenIdProvider
) -> None:
    settings(leader, provider.issuer, create_accounts="true")
    before = people(leader)
    # A mix-up: the browser is sent to another provider with this sign-in's request, and comes back from it.
    start = leader.call(oidc(leader).begin("/"))
    elsewhere = start.redirect_url.replace(provider.issuer, other_provider.issuer)
    params = sign_in_at_provider(elsewhere, "carol", callback(leader))
    assert params["iss"] == other_provider.issuer
    assert "answer came from issuer" in refused(leader, params, start.cookie_value)
    assert "does not name its issuer" in refused(
        leader, {k: v for k, v in params.items() if k != "iss"}, start.cookie_value
    )

    # A provider whose discovery document claims the configured issuer, while its tokens name their real one.
    port = free_port()
    claimed = f"http://127.0.0.1:{port}/"  # its discovery document is read from the same place
    impostor = OpenIdProvider(callback(leader), claim_issuer=claimed, port=port)
    try:
        settings(leader, claimed, create_accounts="true")
        params, cookie, _ = sign_in(leader, "carol")
        assert params["iss"] == impostor.issuer
        params.pop("iss")  # the provider's answer as one that does not name itself (its metadata says it does not)
        reason = refused(leader, params, cookie)
        assert reason == f"the ID token was issued by {impostor.issuer!r}, not by {claimed!r}; it is not taken"
    finally:
        impostor.stop()
    assert people(leader) == before


def test_an_unverified_email_signs_nobody_in(leader: Leader, provider: OpenIdProvider) -> None:
    settings(leader, provider.issuer, **MAPPINGS)
    complete(leader, *sign_in(leader, "ada")[:2])
    before = people(leader)
    reason = refused(leader, *sign_in(leader, "mallory")[:2])
    assert reason == "the provider has not verified ada@example.com; verify it there, then sign in again"
    assert people(leader) == before


def test_rotated_keys_are_read_again_and_a_provider_that_is_down_is_said(leader: Leader) -> None:
    provider = OpenIdProvider(callback(leader))
    try:
        settings(leader, provider.issuer, create_accounts="true")
        assert complete(leader, *sign_in(leader, "bob")[:2]).email == "bob@example.com"
        provider.restart()  # a new signing key under a new key id
        assert complete(leader, *sign_in(leader, "bob")[:2]).email == "bob@example.com"

        params, cookie, _ = sign_in(leader, "bob")
        provider.stop()
        before = people(leader)
        assert "token endpoint" in refused(leader, params, cookie) and "could not be reached" in refused(
            leader, params, cookie
        )
        assert people(leader) == before
    finally:
        provider.stop()

    settings(leader, f"http://127.0.0.1:{free_port()}", create_accounts="true")
    with pytest.raises(OidcRefused) as caught:
        leader.call(oidc(leader).begin("/"))
    assert caught.value.reason.startswith("the provider cannot be used now: the provider's discovery document at ")


def test_a_client_secret_that_is_not_stored_is_named(leader: Leader, provider: OpenIdProvider) -> None:
    settings(leader, provider.issuer, create_accounts="true", client_secret="store:auth/not-kept")
    reason = refused(leader, *sign_in(leader, "bob")[:2])
    assert reason.startswith("the client secret store:auth/not-kept is not stored")


def test_get_auth_shows_oidc_from_the_settings_and_bad_settings_are_refused(
    leader: Leader, provider: OpenIdProvider
) -> None:
    settings(leader, provider.issuer, **MAPPINGS)
    status, auth = leader.admin("GET", "/api/v1/auth")
    assert status == 200
    assert auth["oidc"] == {
        "issuer": provider.issuer,
        "client_id": CLIENT_ID,
        "label": "Acme SSO",
        "create_accounts": True,
        "no_passwords": False,
    }
    assert oidc(leader).configured() and oidc(leader).view().label == "Acme SSO"

    status, now = leader.admin("GET", "/api/v1/settings")
    for body, says in [
        ("auth:\n  oidc: {issuer: 'https://id.example.com', client_id: opod}\n", "base_url: set the portal's address"),
        (
            "auth:\n  base_url: https://fleet.example.com\n  oidc: {issuer: 'https://id.example.com', client_id: opod, "
            "client_secret: hunter2}\n",
            "auth.oidc.client_secret: must name a stored secret",
        ),
        (
            "auth:\n  oidc: {issuer: 'http://id.example.com', client_id: opod}\n",
            "auth.oidc.issuer: 'http://id.example.com' is plain http",
        ),
        (
            "auth:\n  base_url: https://f.example.com\n  oidc:\n    issuer: 'https://id.example.com'\n    client_id: opod\n"
            "    group_memberships: {eng: [{target: 'team:acme'}]}\n",
            "auth.oidc.group_memberships.eng[0].target: 'team:acme' is not a team path",
        ),
    ]:
        status, answer = leader.admin("PUT", "/api/v1/settings", {"base": now["version"], "body": body})
        assert status == 400 and says in answer["error"], answer

    settings_off = {"base": now["version"], "body": "auth:\n  base_url: https://fleet.example.com\n"}
    status, _ = leader.admin("PUT", "/api/v1/settings", settings_off)
    assert status == 200
    status, auth = leader.admin("GET", "/api/v1/auth")
    assert "oidc" not in auth and not oidc(leader).configured()
    with pytest.raises(OidcRefused, match="auth.oidc.issuer is not set"):
        leader.call(oidc(leader).begin("/"))


def test_a_browser_signs_in_through_the_provider_and_gets_a_session(leader: Leader, provider: OpenIdProvider) -> None:
    settings(leader, provider.issuer, **MAPPINGS)
    with httpx.Client(base_url=leader.url, follow_redirects=False, timeout=10) as browser:
        start = browser.get("/auth/oidc/start", params={"next": "/whoami"})
        assert start.status_code == 302 and start.headers["location"].startswith(f"{provider.issuer}/auth?")
        assert "opod_oidc" in browser.cookies
        params = sign_in_at_provider(start.headers["location"], "ada", callback(leader))
        back = browser.get("/auth/oidc/callback", params=params)
        assert back.status_code == 303 and back.headers["location"] == "/whoami", back.text[:300]
        who = browser.get("/whoami")
        assert who.status_code == 200 and who.json()["email"] == "ada@example.com", who.text
        again = browser.get("/auth/oidc/callback", params=params)  # a replayed answer: its state cookie is gone
        assert again.status_code == 401
