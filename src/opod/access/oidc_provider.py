"""An OpenID provider as opod reads it: its discovery document and its signing keys, fetched from its issuer and kept.

The document is read from ``ISSUER/.well-known/openid-configuration`` and must name exactly the
issuer it was read for; the keys are read from its ``jwks_uri``. Both are kept for
:data:`KEEP_FOR` seconds. An ID token signed with a key id not among those kept makes the keys be
read again at once (a provider rotated its keys), and again for another unknown one only after
:data:`REFETCH_EVERY` seconds, so a stream of made-up key ids cannot turn opod into a load on the provider.
httpx2 and joserfc are imported by the reads, not at the leader's start (see :mod:`opod.access.oidc`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from joserfc.jwk import KeySet

KEEP_FOR = 3600.0
REFETCH_EVERY = 30.0
HTTP_TIMEOUT = 10.0
SIGNING_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
"""The ID token signatures opod takes: the provider's public keys only (never ``none``, never the client secret)."""


class ProviderUnusable(Exception):
    """The provider did not answer, or answered with something opod cannot use; the message says which and why."""


@dataclass(frozen=True, slots=True)
class ProviderMetadata:
    """What opod uses of a provider's discovery document."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str
    """Empty when the provider has none."""
    iss_in_answers: bool
    """The provider puts ``iss`` in its authorization answers (RFC 9207), so an answer without it is refused."""
    algorithms: tuple[str, ...]
    """The signatures of :data:`SIGNING_ALGORITHMS` its ID tokens may carry."""


@dataclass(slots=True)
class _Kept:
    metadata: ProviderMetadata
    keys: KeySet | None
    read_at: float
    refetched_at: float = float("-inf")
    """When the keys were last read again for an unknown key id."""


def discovery_url(issuer: str) -> str:
    """Where an issuer's discovery document is (OpenID Connect Discovery 1.0, section 4)."""
    return issuer.rstrip("/") + "/.well-known/openid-configuration"


class ProviderDirectory:
    """Discovery documents and signing keys by issuer, read when first needed and kept."""

    def __init__(self, *, keep_for: float = KEEP_FOR, refetch_every: float = REFETCH_EVERY) -> None:
        self._keep_for = keep_for
        self._refetch_every = refetch_every
        self._kept: dict[str, _Kept] = {}
        self._lock = asyncio.Lock()

    async def metadata(self, issuer: str) -> ProviderMetadata:
        """The provider's discovery document; ``ProviderUnusable`` when it cannot be read or names another issuer."""
        return (await self._entry(issuer)).metadata

    async def keys(self, issuer: str, kid: str | None) -> KeySet:
        """The provider's signing keys, read again when ``kid`` is not among them (a rotation)."""
        async with self._lock:
            entry = await self._entry_locked(issuer)
            now = time.monotonic()
            if entry.keys is None:
                entry.keys = await _read_keys(entry.metadata.jwks_uri)
            elif kid is not None and not _has_kid(entry.keys, kid) and now - entry.refetched_at >= self._refetch_every:
                entry.keys = await _read_keys(entry.metadata.jwks_uri)
                entry.refetched_at = now
            assert entry.keys is not None
            return entry.keys

    def forget(self, issuer: str) -> None:
        """Read the issuer's document and keys again when next needed."""
        self._kept.pop(issuer, None)

    async def _entry(self, issuer: str) -> _Kept:
        async with self._lock:
            return await self._entry_locked(issuer)

    async def _entry_locked(self, issuer: str) -> _Kept:
        entry = self._kept.get(issuer)
        if entry is None or time.monotonic() - entry.read_at >= self._keep_for:
            entry = _Kept(await _read_metadata(issuer), None, time.monotonic())
            self._kept[issuer] = entry
        return entry


def _has_kid(keys: KeySet, kid: str) -> bool:
    return any(key.kid == kid for key in keys)


async def _get_json(url: str, what: str) -> dict[str, Any]:
    import httpx2

    try:
        async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT, follow_redirects=False) as client:
            answer = await client.get(url, headers={"Accept": "application/json"})
    except httpx2.HTTPError as err:
        raise ProviderUnusable(
            f"the provider's {what} at {url} could not be read: {err or type(err).__name__}"
        ) from None
    if answer.status_code != 200:
        raise ProviderUnusable(f"the provider's {what} at {url} answered {answer.status_code}")
    try:
        body = answer.json()
    except ValueError:
        raise ProviderUnusable(f"the provider's {what} at {url} is not JSON") from None
    if not isinstance(body, dict):
        raise ProviderUnusable(f"the provider's {what} at {url} is not a JSON object")
    return body


async def _read_metadata(issuer: str) -> ProviderMetadata:
    url = discovery_url(issuer)
    body = await _get_json(url, "discovery document")
    if body.get("issuer") != issuer:
        raise ProviderUnusable(
            f"the discovery document at {url} names issuer {body.get('issuer')!r}, not {issuer!r}: "
            "set auth.oidc.issuer to exactly the provider's issuer"
        )
    missing = [k for k in ("authorization_endpoint", "token_endpoint", "jwks_uri") if not isinstance(body.get(k), str)]
    if missing:
        raise ProviderUnusable(f"the discovery document at {url} has no {', '.join(missing)}")
    offered = body.get("id_token_signing_alg_values_supported") or ["RS256"]
    algorithms = tuple(a for a in SIGNING_ALGORITHMS if a in offered)
    if not algorithms:
        raise ProviderUnusable(
            f"the provider signs ID tokens only with {offered}; opod takes {', '.join(SIGNING_ALGORITHMS)}"
        )
    userinfo = body.get("userinfo_endpoint")
    return ProviderMetadata(
        issuer=issuer,
        authorization_endpoint=body["authorization_endpoint"],
        token_endpoint=body["token_endpoint"],
        jwks_uri=body["jwks_uri"],
        userinfo_endpoint=userinfo if isinstance(userinfo, str) else "",
        iss_in_answers=body.get("authorization_response_iss_parameter_supported") is True,
        algorithms=algorithms,
    )


async def _read_keys(url: str) -> KeySet:
    from joserfc.errors import JoseError
    from joserfc.jwk import KeySet

    body = await _get_json(url, "signing keys")
    keys = [k for k in body.get("keys", []) if isinstance(k, dict) and k.get("use", "sig") == "sig"]
    try:
        return KeySet.import_key_set({"keys": keys})
    except (JoseError, ValueError, TypeError) as err:
        raise ProviderUnusable(f"the provider's signing keys at {url} cannot be read: {err}") from None


__all__ = [
    "SIGNING_ALGORITHMS",
    "ProviderDirectory",
    "ProviderMetadata",
    "ProviderUnusable",
    "discovery_url",
]
