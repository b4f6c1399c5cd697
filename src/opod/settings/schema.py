"""What the cluster's settings body may hold: one pydantic model per section, unknown keys refused.

Every field has a default, so an empty body is valid and means "nothing configured". Each field's
``description`` is its documentation; docs/settings.md lists every one of them (a test keeps the two equal).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from opod.contract.durations import seconds as duration_seconds


def _lifetime(text: str) -> str:
    if text:
        duration_seconds(text)
    return text


Lifetime = Annotated[str, AfterValidator(_lifetime)]
"""A key lifetime as a duration text; empty means unbounded."""


class Section(BaseModel):
    """A part of the settings body: unknown keys are refused rather than dropped, so a typo is seen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Price(Section):
    """The price of one model's tokens, in currency units per million tokens."""

    input_per_million: float = Field(0, ge=0, description="Price of one million prompt tokens, in currency units.")
    output_per_million: float = Field(0, ge=0, description="Price of one million completion tokens, in currency units.")

    def cost_micros(self, prompt: int, completion: int) -> int:
        """A request's cost in millionths of a currency unit (a price per million tokens is micros per token)."""
        return round(prompt * self.input_per_million + completion * self.output_per_million)


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


class OidcSettings(Section):
    """Sign-in through an OpenID Connect provider."""

    no_passwords: bool = Field(False, description="Turn local passwords off: people sign in through the provider.")


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
    base_url: str = Field("", description="The members' portal's address as people reach it (https://llm.example.com).")
    session_lifetime: Annotated[str, AfterValidator(_positive_duration)] = Field(
        "12h", description="How long a session lasts after sign-in, however it is used."
    )
    session_idle: Annotated[str, AfterValidator(_positive_duration)] = Field(
        "1h", description="How long a session lasts unused."
    )
    oidc: OidcSettings = Field(default_factory=OidcSettings, description="Sign-in through an OpenID Connect provider.")


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
    routing_profiles: Annotated[dict[str, RoutingProfile], AfterValidator(_profile_names)] = Field(
        default_factory=dict,
        description="Named routings a key may ask for (its routing_profile); 'default' is the policy file's.",
    )

    def price(self, model: str) -> Price:
        """The price of ``model``: its own, else the ``"*"`` default, else free."""
        return self.prices.get(model) or self.prices.get("*") or Price()
