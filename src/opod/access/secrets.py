"""The secrets people sign in with and identity providers call with: kept in the store, never shown again.

``PUT /api/v1/auth/secrets/{name}`` keeps one of :data:`AUTH_SECRETS` as ``auth/NAME``, which the
settings name as ``store:auth/NAME``. SCIM (``/scim/v2``) is on while its bearer token is stored:
``auth/scim-token``, unless the settings' ``auth.scim_token`` names another stored secret.
No answer and no audit row holds a secret's value.
"""

from __future__ import annotations

from opod.settings.holder import SettingsHolder
from opod.store import Store
from opod.store.audit import AuditDraft
from opod.store.errors import InvalidInput
from opod.store.offloop import run_sync
from opod.store.secrets import SecretRecord

AUTH_SECRETS = ("ldap-bind", "oidc-client-secret", "scim-token")
"""The secrets ``PUT /auth/secrets/{name}`` keeps, each as ``auth/NAME``."""
SCIM_TOKEN_SECRET = "auth/scim-token"


def secret_reference(name: str) -> str:
    """How the settings name a stored secret."""
    return f"store:auth/{name}"


class AuthSecrets:
    """The one writer of the sign-in secrets; reads the SCIM token for ``/scim/v2``."""

    def __init__(self, store: Store, settings: SettingsHolder) -> None:
        self.store = store
        self.settings = settings

    def scim_secret_name(self) -> str:
        """The stored secret SCIM's bearer token is: ``auth/scim-token``, unless the settings name another
        (``store:NAME``)."""
        named = self.settings.current.auth.scim_token
        return named.removeprefix("store:") if named.startswith("store:") else SCIM_TOKEN_SECRET

    async def scim_token(self) -> str | None:
        """The token SCIM's callers must send; None while none is stored (SCIM is off)."""
        return await run_sync(self.store.get_secret, self.scim_secret_name())

    async def scim_on(self) -> bool:
        """Whether SCIM's token is stored (read without its value)."""
        return await run_sync(self.store.secret_info, self.scim_secret_name()) is not None

    async def named(self, reference: str) -> str | None:
        """The value of the stored secret the settings name as ``store:NAME``; None while none is stored."""
        return await run_sync(self.store.get_secret, reference.removeprefix("store:"))

    async def put(self, name: str, value: str | None, *, audit: AuditDraft) -> SecretRecord:
        """Keep ``value`` as ``auth/NAME``, replacing the one before; ``InvalidInput`` for another name or no value."""
        if name not in AUTH_SECRETS:
            raise InvalidInput(f"name: {name!r} is not a secret opod keeps; use one of {', '.join(AUTH_SECRETS)}")
        if not value:
            raise InvalidInput('value: send the secret as {"value": "..."}; it is stored, never shown again')
        detail = {"name": name, "reference": secret_reference(name)}
        with audit.commit(target=f"secret:auth/{name}", detail=detail) as row:
            return await run_sync(self.store.put_secret, f"auth/{name}", value, by=audit.actor, audit=row)


__all__ = ["AUTH_SECRETS", "SCIM_TOKEN_SECRET", "AuthSecrets", "secret_reference"]
