"""Wire types of opod's own ``/api/v1/accounts``: local accounts an admin makes, their passwords, roles and states."""

from __future__ import annotations

from datetime import datetime

from opod.contract.admin.base import ApiModel, ApiRequest


class AccountRequest(ApiRequest):
    """A new person who signs in with a local password."""

    email: str | None = None
    name: str | None = None
    role: str | None = None
    """viewer, operator, billing, admin, or empty (uses the fleet only)."""
    password: str | None = None


class PasswordRequest(ApiRequest):
    password: str | None = None


class AccountChange(ApiRequest):
    """A person's role or state; a field left out stays as it is."""

    role: str | None = None
    state: str | None = None
    """active, or disabled (their sessions end and their keys are refused at once)."""


class PasswordSet(ApiModel):
    id: str | None = None
    updated_at: datetime | None = None
