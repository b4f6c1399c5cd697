"""What the cluster's settings body may hold: one pydantic model per section, unknown keys refused.

Every field has a default, so an empty body is valid and means "nothing configured". Each field's
``description`` is its documentation; docs/settings.md lists every one of them (a test keeps the two equal).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator

from opod.contract.durations import seconds as duration_seconds
from opod.settings.guard import GuardSettings
from opod.settings.section import Section


def _lifetime(text: str) -> str:
    if text:
        duration_seconds(text)
    return text


Lifetime = Annotated[str, AfterValidator(_lifetime)]
"""A key lifetime as a duration text; empty means unbounded."""


class Price(Section):
    """The price of one model's tokens, in currency units per million tokens."""

    input_per_million: float = Field(0, ge=0, description="Price of one million prompt tokens, in currency units.")
    output_per_million: float = Field(0, ge=0, description="Price of one million completion tokens, in currency units.")


class Budget(Section):
    """The most a scope may spend in one period; a request that would pass it is refused with 429."""

    scope: str = Field(
        min_length=1,
        description="The scope the budget governs: org:NAME, team:ORG/TEAM, project:ORG/TEAM/PROJECT, or an ID.",
    )
    period: Literal["day", "week", "month"] = Field("month", description="The period the spend is counted over (UTC).")
    micros: int = Field(ge=0, description="The budget, in millionths of a currency unit.")


class ProjectRetention(Section):
    """One project's own retention, in place of the cluster's defaults."""

    requests_days: int | None = Field(
        None, ge=0, description="Days its request records are kept (the cluster's when absent)."
    )
    bodies: bool | None = Field(
        None, description="Whether its request and answer bodies are kept (the cluster's when absent)."
    )
    body_max_bytes: int | None = Field(None, ge=0, description="Bytes of a body kept before it is marked truncated.")
    bodies_days: int | None = Field(None, ge=0, description="Days its bodies are kept (the cluster's when absent).")


class Retention(Section):
    """How long request records and bodies are kept."""

    requests_days: int = Field(30, ge=0, description="Days a request's record (not its body) is kept.")
    bodies: bool = Field(
        False, description="Whether request and answer bodies are kept at all; a request's no_store wins."
    )
    body_max_bytes: int = Field(
        65536, ge=0, description="Bytes of a body kept; a longer body is cut and marked truncated."
    )
    bodies_days: int = Field(7, ge=0, description="Days a kept body is kept.")
    projects: dict[str, ProjectRetention] = Field(
        default_factory=dict,
        description="Per-project retention, by project scope text or ID, in place of the defaults.",
    )


class Webhook(Section):
    """One receiver of the events operators act on, signed with its secret and retried with back-off."""

    url: str = Field(min_length=1, description="Where events are POSTed (http or https).")
    secret: str = Field(
        "", description="The signing secret, or store:NAME naming a stored secret; unsigned when empty."
    )
    events: list[str] = Field(
        default_factory=list,
        description="The event types sent (node.lost, model.parked, budget.crossed, quota.hit); every type when empty.",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value


class Prometheus(Section):
    """The Prometheus server metrics/range asks."""

    url: str = Field(
        "", description="The Prometheus server's base URL; metrics/range answers configured: false when empty."
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://, or be empty")
        return value


class KeyRules(Section):
    """Bounds on the lifetime of API keys."""

    max_lifetime: Lifetime = Field(
        "", description="The longest lifetime of any key, as a duration (720h); unbounded when empty."
    )
    scopes: dict[str, Lifetime] = Field(
        default_factory=dict,
        description="Scope text or ID → the longest lifetime of a key in that scope, as a duration.",
    )


def _http_address(value: str) -> str:
    """An http(s) address with no query or fragment, without its trailing slash; http only on loopback."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) address; write https://HOST[:PORT][/PATH]")
    if parts.query or parts.fragment:
        raise ValueError(f"{value!r} has a query or fragment; give the address alone")
    if parts.scheme == "http" and parts.hostname not in _LOOPBACK:
        raise ValueError(f"{value!r} is plain http on another machine; use https (http only on loopback)")
    return value


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class OidcMembership(Section):
    """A place the members of a provider's group belong, kept in step at each sign-in."""

    target: str = Field(
        min_length=1,
        description="Where: org:NAME, team:ORG/TEAM, project:ORG/TEAM/PROJECT, or an ID.",
    )
    role: Literal["member", "manager"] = Field("member", description="Their role there: member or manager.")


class OidcSettings(Section):
    """Single sign-on through an OpenID provider (Entra ID, Keycloak, Okta): the authorization code flow with PKCE."""

    issuer: str = Field(
        "",
        description="The provider's issuer, exactly as its tokens name it (its discovery document is read from ISSUER/.well-known/openid-configuration); OpenID Connect is off when empty.",
    )
    client_id: str = Field("", description="opod's client id at the provider.")
    client_secret: str = Field(
        "store:auth/oidc-client-secret",
        description="Where opod's client secret is: store:NAME (set with PUT /api/v1/auth/secrets/oidc-client-secret); empty for a public client (PKCE alone).",
    )
    scopes: list[str] = Field(
        default_factory=lambda: ["openid", "email", "profile"],
        description="The scopes asked for; openid is required (add groups where the provider sends groups by a scope).",
    )
    label: str = Field("", description="What the sign-in button says (Sign in with LABEL).")
    create_accounts: bool = Field(
        False, description="Make an account for a person the provider vouches for whom opod does not know yet."
    )
    no_passwords: bool = Field(False, description="Turn local passwords off: people sign in through the provider only.")
    email_claim: str = Field("email", min_length=1, description="The claim that holds a person's e-mail address.")
    name_claim: str = Field("name", min_length=1, description="The claim that holds a person's display name.")
    groups_claim: str = Field("groups", min_length=1, description="The claim that lists a person's groups.")
    group_roles: dict[str, Literal["viewer", "operator", "billing", "admin"]] = Field(
        default_factory=dict,
        description="Provider group → the role its members hold (viewer, operator, billing, admin); when any is set, a person's role follows their groups at each sign-in (the strongest wins, none when no group maps).",
    )
    group_memberships: dict[str, list[OidcMembership]] = Field(
        default_factory=dict,
        description="Provider group → the places its members belong; at each sign-in a person joins the places of their groups and leaves the places named here that their groups no longer give.",
    )

    @field_validator("issuer")
    @classmethod
    def _issuer(cls, value: str) -> str:
        return _http_address(value) if value else value

    @field_validator("client_secret")
    @classmethod
    def _stored(cls, value: str) -> str:
        if value and (not value.startswith("store:") or value == "store:"):
            raise ValueError(
                "must name a stored secret, store:NAME (PUT /api/v1/auth/secrets/oidc-client-secret keeps it as "
                "store:auth/oidc-client-secret), or be empty for a public client; the settings never hold a secret"
            )
        return value

    @field_validator("scopes")
    @classmethod
    def _openid(cls, value: list[str]) -> list[str]:
        if "openid" not in value:
            raise ValueError("must include openid: without it the provider sends no ID token")
        if any(not s or any(c.isspace() for c in s) for s in value):
            raise ValueError("a scope is one word with no spaces")
        return value

    @model_validator(mode="after")
    def _complete(self) -> OidcSettings:
        if self.issuer and not self.client_id:
            raise ValueError("client_id: give opod's client id at the provider, or leave issuer empty to turn it off")
        if self.no_passwords and not self.issuer:
            raise ValueError("no_passwords: set issuer too, or nobody could sign in")
        return self


DirectoryRole = Literal["viewer", "operator", "billing", "admin"]
_LDAP_ATTRIBUTE = re.compile(r"^(?:[A-Za-z][A-Za-z0-9-]*|\d+(?:\.\d+)+)$")


def _ldap_attribute(value: str) -> str:
    if not _LDAP_ATTRIBUTE.match(value):
        raise ValueError(f"{value!r} is not an LDAP attribute name: letters, digits and -, like uid or sAMAccountName")
    return value


def _ldap_filter(value: str) -> str:
    """One LDAP filter as RFC 4515 writes it (in balanced parentheses; a parenthesis in a value is written \\28)."""
    depth, closed_at = 0, -1
    for index, char in enumerate(value):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            break
        if depth == 0 and char == ")" and closed_at < 0:
            closed_at = index
    if not value.startswith("(") or depth != 0:
        raise ValueError(
            f"{value!r} is not an LDAP filter; write it in balanced parentheses, like (objectClass=person)"
        )
    if closed_at != len(value) - 1:
        raise ValueError(f"{value!r} is several LDAP filters; join them in one, like (&(objectClass=person)(mail=*))")
    return value


def _at_least_a_second(value: str) -> str:
    if duration_seconds(value) < 1:
        raise ValueError(f"{value!r} is too short; at least 1s")
    return value


LDAPFilter = Annotated[str, AfterValidator(_ldap_filter)]
LDAPAttribute = Annotated[str, AfterValidator(_ldap_attribute)]


class LDAPGroups(Section):
    """Where the directory's groups are, and how a group lists its members."""

    base_dn: str = Field("", description="Where groups are searched; the directory's base_dn when empty.")
    filter: LDAPFilter = Field(
        "(|(objectClass=groupOfNames)(objectClass=groupOfUniqueNames)(objectClass=posixGroup)(objectClass=group))",
        description="Which entries are groups (an LDAP filter).",
    )
    member_attribute: LDAPAttribute = Field(
        "member",
        description="The attribute listing a group's members: by DN (member, uniqueMember) or by login (memberUid).",
    )
    name_attribute: LDAPAttribute = Field(
        "cn", description="The attribute holding a group's name, as roles and memberships name the group."
    )


class LDAPMembership(Section):
    """The members of one directory group put in one organization, team or project."""

    group: str = Field(min_length=1, description="The group, by its name (groups.name_attribute) or its DN.")
    target: str = Field(
        min_length=1,
        description="Where its members belong: org:NAME, team:ORG/TEAM, project:ORG/TEAM/PROJECT, or an ID.",
    )
    role: Literal["member", "manager"] = Field("member", description="Their role there: member or manager.")


class LDAPSettings(Section):
    """Sign-in checked by a directory (OpenLDAP, Active Directory), its groups as roles and memberships; off while
    ``urls`` is empty. The service account's password is never in the body: ``bind_password`` names a stored secret."""

    urls: list[str] = Field(
        default_factory=list,
        description="The directory's servers, tried in order (ldap://HOST:389 or ldaps://HOST:636); LDAP is off when empty.",
    )
    base_dn: str = Field("", description="Where people are searched (dc=example,dc=com); required with urls.")
    bind_dn: str = Field(
        "", description="The service account that searches the directory; anonymous searches when empty."
    )
    bind_password: str = Field(
        "store:auth/ldap-bind",
        description="The service account's password, as store:NAME naming a stored secret (PUT /api/v1/auth/secrets/ldap-bind).",
    )
    login_attribute: LDAPAttribute = Field(
        "uid", description="The attribute people sign in with: uid (OpenLDAP) or sAMAccountName (Active Directory)."
    )
    user_filter: LDAPFilter = Field(
        "(objectClass=person)", description="Which entries are people who may sign in (an LDAP filter)."
    )
    disabled_filter: str = Field(
        "",
        description="Which of those are disabled there, refused and suspended (an LDAP filter; Active Directory: "
        "(userAccountControl:1.2.840.113556.1.4.803:=2)); none when empty.",
    )
    email_attribute: LDAPAttribute = Field("mail", description="The attribute holding a person's e-mail address.")
    name_attribute: LDAPAttribute = Field("cn", description="The attribute holding a person's display name.")
    groups: LDAPGroups = Field(default_factory=LDAPGroups, description="Where groups are and how they list members.")
    roles: dict[str, DirectoryRole] = Field(
        default_factory=dict,
        description="Group (name or DN) → the role its members get: viewer, operator, billing or admin, the highest "
        "of a person's groups winning (in that order), none when in no such group; roles are left alone when empty.",
    )
    memberships: list[LDAPMembership] = Field(
        default_factory=list, description="Groups whose members belong to an organization, team or project."
    )
    sync_interval: Annotated[str, AfterValidator(_at_least_a_second)] = Field(
        "15m", description="How often the leader reads the whole directory (accounts, suspensions, roles); at least 1s."
    )
    start_tls: bool = Field(False, description="Upgrade ldap:// connections to TLS with StartTLS before binding.")
    tls_verify: bool = Field(True, description="Check the server's TLS certificate (ldaps:// and StartTLS).")
    ca_file: str = Field(
        "", description="A PEM file of the CAs the server's certificate is checked against; the system's when empty."
    )
    timeout: Annotated[str, AfterValidator(_at_least_a_second)] = Field(
        "10s", description="How long one connection, bind or search may take; at least 1s."
    )
    label: str = Field("", description="What the sign-in page calls this directory (Company directory).")

    @field_validator("urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            scheme, _, rest = url.partition("://")
            if scheme.lower() not in ("ldap", "ldaps") or not rest.strip("/"):
                raise ValueError(f"{url!r} is not a directory address; write ldap://HOST:389 or ldaps://HOST:636")
        return urls

    @field_validator("disabled_filter")
    @classmethod
    def _disabled(cls, value: str) -> str:
        return _ldap_filter(value) if value else value

    @field_validator("bind_password")
    @classmethod
    def _stored(cls, value: str) -> str:
        if not value.startswith("store:") or value == "store:":
            raise ValueError(
                "name a stored secret as store:NAME (store:auth/ldap-bind, kept by PUT /api/v1/auth/secrets/ldap-bind); "
                "the password itself is never written in the settings"
            )
        return value

    @model_validator(mode="after")
    def _together(self) -> LDAPSettings:
        if self.urls and not self.base_dn:
            raise ValueError("base_dn is required with urls: where people are searched, like dc=example,dc=com")
        if self.start_tls and any(url.lower().startswith("ldaps://") for url in self.urls):
            raise ValueError(
                "start_tls is for ldap:// URLs; an ldaps:// URL is TLS from the start, so leave start_tls off"
            )
        return self

    @property
    def timeout_seconds(self) -> float:
        return duration_seconds(self.timeout)

    @property
    def sync_seconds(self) -> float:
        return duration_seconds(self.sync_interval)


def _grant_text(value: object) -> object:
    return {"target": value} if isinstance(value, str) else value


class ScimGroupGrant(Section):
    """What the members of one identity provider's group get: a membership in an organization, team or project."""

    target: str = Field(
        description="Where the group's members become members, by its path: ORG, ORG/TEAM or ORG/TEAM/PROJECT.",
    )
    role: Literal["member", "manager"] = Field("member", description="The role the group's members hold there.")

    @field_validator("target")
    @classmethod
    def _a_path(cls, value: str) -> str:
        parts = value.split("/")
        if not 1 <= len(parts) <= 3 or any(not p or p != p.strip() for p in parts):
            raise ValueError(f"{value!r} is not a path: write ORG, ORG/TEAM or ORG/TEAM/PROJECT (acme/eng)")
        return value


def _positive_duration(text: str) -> str:
    if duration_seconds(text) <= 0:
        raise ValueError("a duration longer than zero, such as 30m or 12h")
    return text


class AuthSettings(Section):
    """How people and providers authenticate."""

    scim_token: str = Field(
        "",
        description="Where the SCIM provider's bearer token is: store:NAME, or empty for the stored secret auth/scim-token.",
    )
    signup_open: bool = Field(False, description="Whether anyone may make a local account at /signup.")
    session_lifetime: Annotated[str, AfterValidator(_positive_duration)] = Field(
        "12h", description="How long a session lasts after sign-in, however it is used."
    )
    session_idle: Annotated[str, AfterValidator(_positive_duration)] = Field(
        "1h", description="How long a session lasts unused."
    )
    base_url: str = Field(
        "",
        description="The portal's address as people's browsers reach it (https://fleet.example.com); the provider's redirect address is BASE_URL/auth/oidc/callback.",
    )
    oidc: OidcSettings = Field(
        default_factory=OidcSettings,
        description="Single sign-on through an OpenID provider; off while issuer is empty.",
    )
    ldap: LDAPSettings = Field(
        default_factory=LDAPSettings,
        description="Sign-in checked by a directory, and its groups; off while urls is empty.",
    )

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        return _http_address(value).rstrip("/") if value else value

    @model_validator(mode="after")
    def _oidc_redirect(self) -> AuthSettings:
        if self.oidc.issuer and not self.base_url:
            raise ValueError(
                "base_url: set the portal's address; the provider sends people back to BASE_URL/auth/oidc/callback"
            )
        return self

    scim_groups: dict[str, Annotated[ScimGroupGrant, BeforeValidator(_grant_text)]] = Field(
        {},
        description="What the members of each SCIM group (by its displayName, in any case) join: a path, or "
        "{target: PATH, role: member|manager}; a group not named here is kept and grants nothing.",
    )

    @field_validator("scim_groups")
    @classmethod
    def _names_distinct(cls, value: dict[str, ScimGroupGrant]) -> dict[str, ScimGroupGrant]:
        seen: dict[str, str] = {}
        for name in value:
            if not name.strip():
                raise ValueError("a group name is empty; write the displayName the identity provider sends")
            if (folded := name.strip().lower()) in seen:
                raise ValueError(f"{seen[folded]!r} and {name!r} name one group (names match in any case); keep one")
            seen[folded] = name
        return value


class FilesSettings(Section):
    """Bounds on the files clients keep through OpenAI's Files API (/v1/files)."""

    project_bytes: int = Field(
        1 << 30,
        ge=0,
        description="The most bytes of files one project keeps (its keys' uploads and its batches' output files; a key in no project counts alone); an upload that would pass it is refused with 413.",
    )


class RoutingProfile(Section):
    """How the requests of keys that name this profile are routed: each field given replaces the policy file's value."""

    kv_weight: float | None = Field(
        None, ge=0, description="Weight of a worker's KV-cache use in its score (the policy's when absent)."
    )
    kv_saturation_pct: float | None = Field(
        None,
        ge=0,
        le=100,
        description="KV-cache use, in percent, past which a worker is avoided (the policy's when absent).",
    )
    prefix_affinity: bool | None = Field(
        None, description="Keep a conversation on the worker that holds its prefix (the policy's when absent)."
    )
    prefix_block_weight: float | None = Field(
        None,
        ge=0,
        description="Weight of the prompt's cached blocks on a worker in its score (the policy's when absent).",
    )


class Generation(Section):
    """Bounds on what one request may make an engine generate."""

    default_max_tokens: int = Field(
        4096,
        ge=1,
        description=(
            "The most tokens a chat or Responses request that names no limit may generate; "
            "less when its prompt leaves less of the model's context."
        ),
    )


_PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


def _profile_names(profiles: dict[str, RoutingProfile]) -> dict[str, RoutingProfile]:
    for name in profiles:
        if name == "default":
            raise ValueError("'default' is the policy file's routing as it is; name a profile otherwise")
        if not _PROFILE_NAME.match(name):
            raise ValueError(f"{name!r} is not a profile name: lowercase letters, digits and ._- (at most 63)")
    return profiles


class ClusterSettings(Section):
    """The whole settings body of the cluster; an empty body is every default."""

    prices: dict[str, Price] = Field(
        default_factory=dict, description='Model name → its token prices; "*" is the price of every model not listed.'
    )
    budgets: list[Budget] = Field(default_factory=list, description="Spending budgets per scope and period.")
    retention: Retention = Field(default_factory=Retention, description="How long request records and bodies are kept.")
    webhooks: list[Webhook] = Field(default_factory=list, description="Receivers of operator events.")
    prometheus: Prometheus = Field(default_factory=Prometheus, description="The Prometheus server metrics/range asks.")
    keys: KeyRules = Field(default_factory=KeyRules, description="Bounds on API key lifetimes.")
    auth: AuthSettings = Field(default_factory=AuthSettings, description="Authentication of people and providers.")
    files: FilesSettings = Field(
        default_factory=FilesSettings, description="Bounds on the files clients upload (/v1/files)."
    )
    generation: Generation = Field(
        default_factory=Generation, description="Bounds on what one request may make an engine generate."
    )
    guard: GuardSettings = Field(
        default_factory=GuardSettings, description="Guard policies the gateway runs itself, and which apply by default."
    )
    routing_profiles: Annotated[dict[str, RoutingProfile], AfterValidator(_profile_names)] = Field(
        default_factory=dict,
        description="Named routings a key may ask for (its routing_profile); 'default' is the policy file's.",
    )

    def price(self, model: str) -> Price:
        """The price of ``model``: its own, else the ``"*"`` default, else free."""
        return self.prices.get(model) or self.prices.get("*") or Price()
