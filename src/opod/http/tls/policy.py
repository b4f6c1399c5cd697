"""The worker-certificate policy the auth file sets (``nodeMtls``, ``nodeCertCa``, ``revokedCerts``), as the TLS plumbing reads it.

The auth file (:mod:`opod.snapshots.auth`) makes it; the listener's context and the join
handlers' certificate check read it. It lives here, below both, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NodeMtls:
    """The auth file's worker-certificate policy, as held (not necessarily enforced: see ``enforced``)."""

    mode: str = "off"
    """``off``, ``allow`` or ``require`` (an empty ``nodeMtls`` is ``off``)."""
    ca_pem: str = ""
    revoked_serials: frozenset[str] = frozenset()
    """Lowercase hex serial numbers without separators."""
    enforced: bool = False
    """True only when a TLS listener on the join path really checks client certificates."""

    def describe(self) -> str:
        if self.mode == "off":
            return "off"
        if self.enforced:
            return self.mode
        return f"{self.mode} (held, not enforced: no TLS listener checks worker certificates; the join token stays the credential)"

    def is_revoked(self, serial: int | str) -> bool:
        """Whether a peer certificate's serial (an int, or hex text with or without colons) is revoked."""
        text = format(serial, "x") if isinstance(serial, int) else serial_text(serial)
        return text in {serial_text(s) for s in self.revoked_serials}


def serial_text(text: str) -> str:
    """A certificate serial as compared: lowercase hex, no colons, no leading zeros."""
    return text.lower().replace(":", "").lstrip("0") or "0"
