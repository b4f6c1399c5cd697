"""Signing in through an OpenID provider (``auth.oidc``): the authorization code flow with PKCE.

:meth:`OidcSignIn.begin` sends the browser to the provider with a fresh state, nonce and PKCE
verifier, and seals them, with where to go afterwards, into a cookie value the browser carries
back (sealed with a key of its own derived from the secrets key, so any leader sharing the store
completes it and none keeps a per-client state). :meth:`OidcSignIn.complete` checks the answer
against that cookie, exchanges the code, validates the ID token (the provider's signature, the
issuer exactly the configured one, this client as audience, not expired, this sign-in's nonce),
then finds the person by the provider's subject (``external_id``) or e-mail, makes them when
``create_accounts`` says so, keeps their role and memberships in step with their groups, and
records the sign-in. Every refusal is an :class:`OidcRefused` saying why; nothing about the people
changes before the token is accepted.

authlib, joserfc and httpx2 are imported by the steps that use them: every leader builds an
:class:`OidcSignIn` at start, few ever sign anyone in through a provider, and the three are slow to
import.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from opod.access.group_rules import GroupRules
from opod.access.members import Memberships
from opod.access.oidc_provider import ProviderDirectory, ProviderMetadata, ProviderUnusable
from opod.access.people import DISABLED, People
from opod.access.secrets import AuthSecrets
from opod.contract.admin.tenancy import OIDCView
from opod.security.sealed_state import StateSeal
from opod.settings.holder import SettingsHolder
from opod.settings.schema import AuthSettings, OidcSettings
from opod.store.audit import SOURCE_WEB, AuditDraft
from opod.store.errors import StoreError
from opod.store.offloop import run_sync
from opod.store.people import UserRecord

log = logging.getLogger("opod.access.oidc")

CALLBACK_PATH = "/auth/oidc/callback"
COOKIE_MAX_AGE = 600
"""Seconds a sign-in may spend at the provider before its cookie is refused."""
SEAL_PURPOSE = "oidc sign-in"
ACTION = f"GET {CALLBACK_PATH}"
"""How the audit names a change a sign-in made."""
CLOCK_LEEWAY = 60


class OidcRefused(Exception):
    """A sign-in through the provider refused; ``reason`` says why and what to do."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class OidcStart:
    """Where to send the browser, and the cookie value it must bring back to the callback."""

    redirect_url: str
    cookie_value: str
    max_age: int = COOKIE_MAX_AGE
    """Seconds the cookie is good for."""


@dataclass(frozen=True, slots=True)
class _Pending:
    """What a started sign-in sealed into its cookie."""

    state: str
    nonce: str
    verifier: str
    return_to: str
    issuer: str
    client_id: str


def oidc_view(auth: AuthSettings) -> OIDCView | None:
    """``auth.oidc`` as ``GET /api/v1/auth`` shows it; None while it is off."""
    oidc = auth.oidc
    if not oidc.issuer:
        return None
    return OIDCView(
        issuer=oidc.issuer,
        client_id=oidc.client_id,
        label=oidc.label or None,
        create_accounts=oidc.create_accounts,
        no_passwords=oidc.no_passwords,
    )


def redirect_uri(auth: AuthSettings) -> str:
    """Where the provider sends people back: the portal's callback."""
    return auth.base_url + CALLBACK_PATH


def safe_return_to(text: str) -> str:
    """A path on this site to go to after signing in; "/" for anything else (another site, a scheme, ``//host``)."""
    parts = urlsplit(text)
    if not text.startswith("/") or text.startswith("//") or "\\" in text or parts.scheme or parts.netloc:
        return "/"
    return text


class OidcSignIn:
    """Sign-in through ``auth.oidc``'s provider, read from the settings in force at each call."""

    def __init__(
        self,
        settings: SettingsHolder,
        secrets: AuthSecrets,
        people: People,
        members: Memberships,
        seal: StateSeal,
        directory: ProviderDirectory | None = None,
    ) -> None:
        self._settings = settings
        self._secrets = secrets
        self._people = people
        self._members = members
        self._seal = seal
        self._directory = directory or ProviderDirectory()

    # --- what is configured ------------------------------------------------------------------------

    def configured(self) -> bool:
        """Whether ``auth.oidc`` names a provider (the settings refuse one without a client id or ``base_url``)."""
        return bool(self._settings.current.auth.oidc.issuer)

    def view(self) -> OIDCView:
        """``auth.oidc`` as it is in force; empty while it is off."""
        return oidc_view(self._settings.current.auth) or OIDCView()

    def return_to(self, cookie_value: str) -> str:
        """Where the sign-in the cookie seals meant to go afterwards; "/" when it cannot be read."""
        try:
            return self._open(cookie_value).return_to
        except OidcRefused:
            return "/"

    # --- the flow ----------------------------------------------------------------------------------

    async def begin(self, return_to: str) -> OidcStart:
        """The provider's authorization address for a new sign-in, and its sealed cookie value."""
        from authlib.common.security import generate_token
        from authlib.integrations.httpx_client import AsyncOAuth2Client

        auth = self._settings.current.auth
        oidc = self._config(auth)
        metadata = await self._metadata(oidc.issuer)
        pending = _Pending(
            state=generate_token(32),
            nonce=generate_token(32),
            verifier=generate_token(64),
            return_to=safe_return_to(return_to),
            issuer=oidc.issuer,
            client_id=oidc.client_id,
        )
        client = AsyncOAuth2Client(
            client_id=oidc.client_id,
            scope=" ".join(oidc.scopes),
            redirect_uri=redirect_uri(auth),
            code_challenge_method="S256",
        )
        url, _ = client.create_authorization_url(
            metadata.authorization_endpoint, state=pending.state, nonce=pending.nonce, code_verifier=pending.verifier
        )
        await client.aclose()
        cookie = self._seal.seal(
            {
                "s": pending.state,
                "n": pending.nonce,
                "v": pending.verifier,
                "r": pending.return_to,
                "i": pending.issuer,
                "c": pending.client_id,
            }
        )
        return OidcStart(redirect_url=str(url), cookie_value=cookie)

    async def complete(self, params: Mapping[str, str], cookie_value: str) -> UserRecord:
        """The person the provider's answer (the callback's query ``params``) signs in; ``OidcRefused`` saying why not."""
        auth = self._settings.current.auth
        oidc = self._config(auth)
        pending = self._open(cookie_value)
        if params.get("error"):
            described = f": {params['error_description']}" if params.get("error_description") else ""
            raise OidcRefused(f"the provider refused the sign-in: {params['error']}{described}")
        if not hmac.compare_digest(params.get("state", "").encode(), pending.state.encode()):
            raise OidcRefused(
                "the answer's state is not this browser's sign-in (a forged or crossed answer); start again"
            )
        if (pending.issuer, pending.client_id) != (oidc.issuer, oidc.client_id):
            raise OidcRefused("auth.oidc changed while this sign-in was at the provider; start again")
        metadata = await self._metadata(oidc.issuer)
        answered_by = params.get("iss")
        if answered_by is not None and answered_by != oidc.issuer:
            raise OidcRefused(f"the answer came from issuer {answered_by!r}, not {oidc.issuer!r}; start again")
        if answered_by is None and metadata.iss_in_answers:
            raise OidcRefused("the answer does not name its issuer, which this provider always does; start again")
        code = params.get("code")
        if not code:
            raise OidcRefused("the provider's answer holds no code; start again")
        token = await self._exchange(auth, oidc, metadata, code, pending.verifier)
        claims = await self._id_token(oidc, metadata, token, pending.nonce)
        claims = await self._with_userinfo(oidc, metadata, token, claims)
        return await self._sign_in(oidc, claims)

    # --- the provider ------------------------------------------------------------------------------

    def _config(self, auth: AuthSettings) -> OidcSettings:
        if not auth.oidc.issuer:
            raise OidcRefused("sign-in through a provider is off: auth.oidc.issuer is not set")
        return auth.oidc

    def _open(self, cookie_value: str) -> _Pending:
        if not cookie_value:
            raise OidcRefused("this browser started no sign-in here (no sign-in cookie); start again")
        try:
            opened = self._seal.open(cookie_value, COOKIE_MAX_AGE)
            return _Pending(
                state=str(opened["s"]),
                nonce=str(opened["n"]),
                verifier=str(opened["v"]),
                return_to=safe_return_to(str(opened["r"])),
                issuer=str(opened["i"]),
                client_id=str(opened["c"]),
            )
        except (ValueError, KeyError):
            raise OidcRefused(
                f"the sign-in cookie is altered, from another opod, or older than {COOKIE_MAX_AGE // 60} minutes; start again"
            ) from None

    async def _metadata(self, issuer: str) -> ProviderMetadata:
        try:
            return await self._directory.metadata(issuer)
        except ProviderUnusable as err:
            raise OidcRefused(f"the provider cannot be used now: {err}") from None

    async def _client_secret(self, oidc: OidcSettings) -> str:
        if not oidc.client_secret:
            return ""
        name = oidc.client_secret.removeprefix("store:")
        secret = await run_sync(self._secrets.store.get_secret, name)
        if not secret:
            raise OidcRefused(
                f"the client secret {oidc.client_secret} is not stored: "
                "PUT /api/v1/auth/secrets/oidc-client-secret keeps it (or name another in auth.oidc.client_secret)"
            )
        return secret

    async def _exchange(
        self, auth: AuthSettings, oidc: OidcSettings, metadata: ProviderMetadata, code: str, verifier: str
    ) -> dict[str, Any]:
        import httpx2
        from authlib.integrations.httpx_client import AsyncOAuth2Client, OAuthError

        secret = await self._client_secret(oidc)
        client = AsyncOAuth2Client(
            client_id=oidc.client_id,
            client_secret=secret or None,
            token_endpoint_auth_method="client_secret_basic" if secret else "none",
            redirect_uri=redirect_uri(auth),
            timeout=httpx2.Timeout(10.0),
        )
        try:
            async with client:
                token = await client.fetch_token(
                    metadata.token_endpoint, grant_type="authorization_code", code=code, code_verifier=verifier
                )
        except OAuthError as err:
            described = f": {err.description}" if err.description else ""
            raise OidcRefused(f"the provider would not exchange the code: {err.error}{described}") from None
        except httpx2.HTTPError as err:
            raise OidcRefused(
                f"the provider's token endpoint {metadata.token_endpoint} could not be reached: "
                f"{err or type(err).__name__}"
            ) from None
        except ValueError as err:
            raise OidcRefused(f"the provider's token answer cannot be read: {err}") from None
        if not isinstance(token, dict):
            raise OidcRefused("the provider's token answer is not a JSON object")
        return token

    async def _id_token(
        self, oidc: OidcSettings, metadata: ProviderMetadata, token: Mapping[str, Any], nonce: str
    ) -> dict[str, Any]:
        from authlib.oidc.core.claims import CodeIDToken
        from joserfc import jwt
        from joserfc.errors import BadSignatureError, ClaimError, ExpiredTokenError, JoseError
        from joserfc.jws import extract_compact

        raw = token.get("id_token")
        if not isinstance(raw, str) or not raw:
            raise OidcRefused("the provider sent no ID token; is openid among auth.oidc.scopes?")
        try:
            kid = extract_compact(raw.encode()).headers().get("kid")
        except (JoseError, ValueError):
            raise OidcRefused("the ID token is not a signed JWT") from None
        try:
            keys = await self._directory.keys(oidc.issuer, kid)
        except ProviderUnusable as err:
            raise OidcRefused(f"the provider cannot be used now: {err}") from None
        try:
            decoded = jwt.decode(raw, keys, algorithms=list(metadata.algorithms))
        except BadSignatureError:
            raise OidcRefused("the ID token's signature does not verify with the provider's keys") from None
        except (JoseError, ValueError) as err:
            raise OidcRefused(f"the ID token cannot be read with the provider's keys: {err}") from None
        claims = dict(decoded.claims)
        if claims.get("iss") != oidc.issuer:
            raise OidcRefused(
                f"the ID token was issued by {claims.get('iss')!r}, not by {oidc.issuer!r}; it is not taken"
            )
        if not hmac.compare_digest(str(claims.get("nonce", "")).encode(), nonce.encode()):
            raise OidcRefused("the ID token's nonce is not this sign-in's (a replayed or crossed token); start again")
        checked = CodeIDToken(
            claims,
            decoded.header,
            options={
                "iss": {"essential": True, "value": oidc.issuer},
                "aud": {"essential": True, "value": oidc.client_id},
            },
            params={"nonce": nonce, "client_id": oidc.client_id, "access_token": token.get("access_token")},
        )
        try:
            checked.validate(leeway=CLOCK_LEEWAY)
        except ExpiredTokenError:
            raise OidcRefused("the ID token has expired; check this machine's clock, then start again") from None
        except ClaimError as err:
            raise OidcRefused(f"the ID token is not for this sign-in: {err}") from None
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            raise OidcRefused("the ID token names no subject")
        return claims

    async def _with_userinfo(
        self, oidc: OidcSettings, metadata: ProviderMetadata, token: Mapping[str, Any], claims: dict[str, Any]
    ) -> dict[str, Any]:
        """The ID token's claims, with those it lacks (``email_verified`` too) from the provider's userinfo endpoint,
        which must name the same subject."""
        import httpx2

        wanted = (oidc.email_claim, oidc.name_claim, oidc.groups_claim)
        access_token = token.get("access_token")
        if all(c in claims for c in wanted) or not metadata.userinfo_endpoint or not isinstance(access_token, str):
            return claims
        try:
            async with httpx2.AsyncClient(timeout=10.0) as client:
                answer = await client.get(
                    metadata.userinfo_endpoint,
                    headers={"Authorization": f"Bearer {access_token}", "Accept": "application/json"},
                )
            info = answer.json() if answer.status_code == 200 else None
        except (httpx2.HTTPError, ValueError) as err:
            raise OidcRefused(
                f"the provider's userinfo endpoint could not be read: {err or type(err).__name__}"
            ) from None
        if not isinstance(info, dict):
            raise OidcRefused(f"the provider's userinfo endpoint answered {answer.status_code}")
        if info.get("sub") != claims["sub"]:
            raise OidcRefused("the provider's userinfo names another person than its ID token")
        return {**info, **claims}

    # --- the person --------------------------------------------------------------------------------

    async def _sign_in(self, oidc: OidcSettings, claims: Mapping[str, Any]) -> UserRecord:
        subject = str(claims["sub"])
        email = claims.get(oidc.email_claim)
        if not isinstance(email, str) or not email.strip():
            raise OidcRefused(
                f"the provider sent no e-mail address (claim {oidc.email_claim!r}); ask for the email scope, "
                "or name the claim in auth.oidc.email_claim"
            )
        email = email.strip()
        if claims.get("email_verified") is False:
            raise OidcRefused(f"the provider has not verified {email}; verify it there, then sign in again")
        name = claims.get(oidc.name_claim)
        name = name.strip() if isinstance(name, str) else ""
        groups = _groups(claims.get(oidc.groups_claim))
        rules = GroupRules.for_oidc(oidc, self._members.tenancy)
        role = rules.role(groups)
        user = self._find(subject, email)
        if user is not None and user.state == DISABLED:
            raise OidcRefused(f"{email}'s account is disabled; ask an operator")
        try:
            if user is None:
                if not oidc.create_accounts:
                    raise OidcRefused(
                        f"opod has no account for {email}, and auth.oidc.create_accounts is off: "
                        "ask an operator to add you"
                    )
                user = await self._create(email, name, role or "", subject)
            user = await self._follow(user, email, name, role, subject)
            await self._place(user, rules, groups)
        except StoreError as err:
            raise OidcRefused(f"{email} cannot be signed in: {err}") from None
        return user

    def _find(self, subject: str, email: str) -> UserRecord | None:
        for user in self._people.users():
            if user.external_id == subject:
                return user
        return self._people.user(email)

    def _draft(self, email: str, status: int = 200) -> AuditDraft:
        return AuditDraft(actor=email, source=SOURCE_WEB, action=ACTION, status=status)

    async def _create(self, email: str, name: str, role: str, subject: str) -> UserRecord:
        detail = {"email": email, "name": name, "role": role, "external_id": subject, "by": "oidc"}
        with self._draft(email, 201).commit(target="user", detail=detail) as row:
            return await self._people.create(email=email, name=name, role=role, external_id=subject, audit=row)

    async def _follow(self, user: UserRecord, email: str, name: str, role: str | None, subject: str) -> UserRecord:
        """The sign-in recorded, with the name, role and subject the provider gives now."""
        changes: dict[str, str] = {}
        if name and name != user.name:
            changes["name"] = name
        if role is not None and role != user.role:
            changes["role"] = role
        if not user.external_id:
            changes["external_id"] = subject
        now = datetime.now(UTC)
        if not changes:
            return await self._people.update(user.id, last_login_at=now)
        with self._draft(email).commit(target=f"user:{user.id}", detail={**changes, "by": "oidc"}) as row:
            return await self._people.update(user.id, last_login_at=now, audit=row, **changes)

    async def _place(self, user: UserRecord, rules: GroupRules, groups: list[str]) -> None:
        """The person's memberships in the places the mapping names, as their groups give them (every group they hold
        shown in the audit, those the mapping does not name as granting nothing)."""
        for problem in rules.problems:
            log.warning("%s; skipped", problem)
        if not rules.targets:
            return
        wanted = rules.places(groups)
        detail = {"memberships": {self._members.path(t): r for t, r in wanted.items()}, "groups": rules.shown(groups)}
        with self._draft(user.email).commit(target=f"user:{user.id}", detail={**detail, "by": "oidc"}) as row:
            await self._people.match_memberships(user.id, wanted, targets=rules.targets, by=user.email, audit=row)


def _groups(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [g for g in value if isinstance(g, str)]
    return []


__all__ = [
    "CALLBACK_PATH",
    "COOKIE_MAX_AGE",
    "SEAL_PURPOSE",
    "OidcRefused",
    "OidcSignIn",
    "OidcStart",
    "oidc_view",
    "redirect_uri",
    "safe_return_to",
]
