"""The auth file (``OPOD_AUTH_FILE``) applied to the gateway's key table through the access service.

Keys from the file enter as ``k_cp_<id>`` (usage rows name them so), with
their expiry, class and team; the whole set replaces the previous file's in one
swap, so a key removed from the file stops working at once. Locally minted
keys are never touched. ``revokedKeys`` are tombstones: once seen they are
refused for good, even when a later file omits the id or lists the key again,
and :class:`~opod.access.service.AccessService` stores them before they take
effect in memory, so a restart does not lift them.

Worker client certificates (``nodeMtls``, ``nodeCertCa``, ``revokedCerts``) are
parsed, validated and held here, and enforced by :mod:`opod.http.tls` on a leader
whose public listener serves TLS (``client_certs_verified``, decided when the
leader is built). Without that listener nothing can check a
certificate: ``allow`` is held but changes nothing (the join token stays the
credential, and the event says so), and ``require`` is refused with a reason
rather than pretended.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from opod.access.keytable import SNAPSHOT, KeyEntry, snapshot_key_id
from opod.access.service import AccessService
from opod.contract.adminapi import AuthSnapshot
from opod.http.tls.policy import NodeMtls
from opod.snapshots.parsing import decode, rfc3339
from opod.snapshots.watch import SnapshotError

_HEX = frozenset("0123456789abcdef")


# --- worker client certificates -------------------------------------------------------


REQUIRE_WITHOUT_TLS = "nodeMtls: 'require' cannot be honoured"
"""How the refusal of ``require`` on a leader without a TLS listener begins."""


def _node_mtls(snap: AuthSnapshot, client_certs_verified: bool) -> NodeMtls:
    mode = snap.node_mtls or "off"
    for i, serial in enumerate(snap.revoked_certs or []):
        if not serial or not set(serial) <= _HEX:
            raise SnapshotError(
                f"revokedCerts[{i}]: {serial!r} is not a serial number in lowercase hex without separators (e.g. 0a1b2c)"
            )
    ca = snap.node_cert_ca.strip()
    if ca:
        if "-----BEGIN CERTIFICATE-----" not in ca:
            raise SnapshotError("nodeCertCa: not PEM; give one or more -----BEGIN CERTIFICATE----- blocks")
        try:
            ssl.create_default_context(cadata=ca)
        except (ssl.SSLError, ValueError) as err:
            raise SnapshotError(
                f"nodeCertCa: the PEM does not load as CA certificates ({err}); give the CA that signs worker certificates"
            ) from None
    if mode in ("allow", "require") and not ca:
        raise SnapshotError(f"nodeMtls: {mode!r} needs nodeCertCa, the PEM of the CA that signs worker certificates")
    if mode == "require" and not client_certs_verified:
        raise SnapshotError(
            REQUIRE_WITHOUT_TLS + ": this leader has no TLS listener that checks worker client "
            "certificates, so every worker would be refused. Write 'allow' or 'off' (the join token stays the credential)."
        )
    return NodeMtls(mode, ca, frozenset(snap.revoked_certs or []), enforced=client_certs_verified and mode != "off")


# --- the applier ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParsedAuth:
    snapshot: AuthSnapshot
    entries: tuple[KeyEntry, ...]
    issued_at: datetime | None
    mtls: NodeMtls
    revoked: frozenset[str] = field(default_factory=frozenset)


class AuthFile:
    """Applies auth snapshots through ``access``. Pass it to a :class:`~opod.snapshots.watch.FileWatcher`."""

    kind = "auth"

    def __init__(self, access: AccessService, *, client_certs_verified: bool = False) -> None:
        self.access = access
        self.client_certs_verified = client_certs_verified
        """True when the leader's public listener serves TLS and so can check worker certificates."""
        self._revision: str | None = None
        self._mtls = NodeMtls()

    @property
    def revision(self) -> str | None:
        return self._revision

    @property
    def node_mtls(self) -> NodeMtls:
        """The current worker-certificate policy (mode ``off`` until a file says otherwise)."""
        return self._mtls

    def parse(self, data: bytes) -> ParsedAuth:
        snap = decode(AuthSnapshot, data, "auth file")
        issued_at = rfc3339(snap.issued_at, "issuedAt")
        revoked = set()
        for i, key_id in enumerate(snap.revoked_keys or []):
            if not key_id.strip():
                raise SnapshotError(f"revokedKeys[{i}]: empty; list the ids of revoked keys")
            revoked.add(snapshot_key_id(key_id.strip()))
        entries = []
        ids: dict[str, int] = {}
        hashes: dict[str, str] = {}
        for i, key in enumerate(snap.keys or []):
            where = f"keys[{i}]"
            if not key.id or not key.id.isprintable() or any(c.isspace() for c in key.id):
                raise SnapshotError(f"{where}.id: {key.id!r} must be a non-empty id without spaces (e.g. alice-laptop)")
            key_id = snapshot_key_id(key.id)  # "bob" and "k_cp_bob" are the same key here
            if key_id in ids:
                raise SnapshotError(f"{where}.id: {key.id!r} is also keys[{ids[key_id]}].id; each key needs its own id")
            ids[key_id] = i
            if len(key.hash) != 64 or not set(key.hash) <= _HEX:
                raise SnapshotError(
                    f"{where}.hash (id {key.id!r}): must be the lowercase hex SHA-256 of the key, 64 characters; never the key itself"
                )
            if key.hash in hashes:
                raise SnapshotError(
                    f"{where}.hash (id {key.id!r}): the same hash as key {hashes[key.hash]!r}; one key, one id"
                )
            hashes[key.hash] = key.id
            expires = rfc3339(key.expires_at, f"{where}.expiresAt (id {key.id!r})")
            entries.append(
                KeyEntry(
                    id=key_id,
                    kind="api",
                    name=key.name or key.id,
                    hash=key.hash,
                    expires_at=expires,
                    team=key.team,
                    admission_class=key.admission_class,
                    scope=key.scope,
                    source=SNAPSHOT,
                )
            )
        mtls = _node_mtls(snap, self.client_certs_verified)
        return ParsedAuth(snap, tuple(entries), issued_at, mtls, frozenset(revoked))

    def apply(self, parsed: ParsedAuth) -> dict[str, Any]:
        snap = parsed.snapshot
        added = self.access.add_tombstones(parsed.revoked)
        self.access.apply_auth_file(snap.revision, snap.require_keys, parsed.issued_at, parsed.entries)
        self._mtls = parsed.mtls
        self._revision = snap.revision
        keys = self.access.keys
        served = len(keys.snapshot_keys())
        data: dict[str, Any] = {
            "revision": snap.revision,
            "keys": served,
            "require_keys": snap.require_keys,
            "issued_at": snap.issued_at,
            "revoked_keys": len(keys.tombstones),
            "node_mtls": parsed.mtls.describe(),
        }
        if added.new:
            data["new_revoked_keys"] = sorted(added.new)
        if len(parsed.entries) != served:
            data["refused_rows"] = sorted(e.id for e in parsed.entries if e.id in keys.tombstones)
        if not added.persisted:
            data["warning"] = (
                "revoked keys apply now but could not be saved; a restart may forget those the file no longer lists"
            )
        return data
