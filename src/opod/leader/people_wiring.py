"""How people sign in, built once for the composition root: local accounts, OpenID Connect, the directory.

Each piece reads the cluster's settings when it is used, so the settings' ``auth`` block can change
while the leader serves; the pieces are made here once and shared by the management API, the
console and the portal.
"""

from __future__ import annotations

from dataclasses import dataclass

from opod.access.directory import Directory, DirectoryDown, DirectoryRefused
from opod.access.members import Memberships
from opod.access.oidc import SEAL_PURPOSE, OidcRefused, OidcSignIn
from opod.access.people import People
from opod.access.permissions import Permissions
from opod.access.secrets import AuthSecrets
from opod.access.service import AccessService
from opod.access.sessions import Sessions
from opod.access.signin import DirectoryPlug, OidcPlug, SignIn
from opod.access.tenancy import Tenancy
from opod.security.sealed_state import StateSeal
from opod.security.sealing import SecretsKey
from opod.settings.holder import SettingsHolder
from opod.store import Store


@dataclass(frozen=True, slots=True)
class PeopleParts:
    members: Memberships
    secrets: AuthSecrets
    oidc: OidcSignIn
    directory: Directory
    signin: SignIn
    permissions: Permissions


def build_people(
    store: Store,
    settings: SettingsHolder,
    people: People,
    tenancy: Tenancy,
    access: AccessService,
    secrets_key: SecretsKey,
) -> PeopleParts:
    """``secrets_key``: the leader's sealing key; the OpenID state cookie is sealed with a key derived from it."""
    members, secrets = Memberships(people, tenancy, access), AuthSecrets(store, settings)
    oidc = OidcSignIn(settings, secrets, people, members, StateSeal(secrets_key.derive(SEAL_PURPOSE)))
    directory = Directory(settings, secrets, people, tenancy)
    signin = SignIn(
        store,
        people,
        settings,
        Sessions(store, settings),
        directory=DirectoryPlug(directory, DirectoryRefused, DirectoryDown),
        oidc=OidcPlug(oidc, OidcRefused),
    )
    return PeopleParts(
        members=members,
        secrets=secrets,
        oidc=oidc,
        directory=directory,
        signin=signin,
        permissions=Permissions(people, tenancy),
    )
