"""Real certificates for the TLS tests, made with the ``openssl`` command (``cryptography`` is not installed).

Two CAs: ``ca`` signs the leader's server certificate (127.0.0.1, localhost) and
the worker certificates; ``other_ca`` signs a second set, for a leader or a
worker the other side must not trust. Worker certificates carry the SPIFFE URI
SAN ``spiffe://test.opod/opod/node/<id>``; each has a fixed serial so an auth
file can revoke it.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

TRUST_DOMAIN = "test.opod"


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path
    serial: str
    """Lowercase hex, no separators (as ``revokedCerts`` lists it)."""

    @property
    def pem(self) -> str:
        return self.cert.read_text()


def available() -> bool:
    return shutil.which("openssl") is not None


def _run(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, text=True)


def make_ca(folder: Path, name: str) -> Pair:
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    _run(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(cert),
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    return Pair(cert, key, "")


def make_leaf(folder: Path, name: str, ca: Pair, serial: int, san: str, usage: str, days: int = 2) -> Pair:
    key, csr, cert, ext = (folder / f"{name}.{s}" for s in ("key", "csr", "pem", "ext"))
    _run(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        f"/CN={name}",
    )
    ext.write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n")
    _run(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca.cert),
        "-CAkey",
        str(ca.key),
        "-set_serial",
        hex(serial),
        "-days",
        str(days),
        "-out",
        str(cert),
        "-extfile",
        str(ext),
    )
    return Pair(cert, key, format(serial, "x"))


def node_san(node_id: str) -> str:
    return f"URI:spiffe://{TRUST_DOMAIN}/opod/node/{node_id}"


@dataclass(frozen=True)
class Certs:
    ca: Pair
    other_ca: Pair
    leader: Pair
    """Signed by ``ca``, for 127.0.0.1 and localhost."""
    other_leader: Pair
    """Signed by ``other_ca``, same names."""
    workers: dict[str, Pair]
    """Node id → certificate signed by ``ca``."""
    other_workers: dict[str, Pair]
    """Node id → certificate signed by ``other_ca``."""
    no_node: Pair
    """Signed by ``ca`` with no node SAN (a client certificate for something else)."""


def make_all(folder: Path) -> Certs:
    folder.mkdir(parents=True, exist_ok=True)
    ca, other = make_ca(folder, "ca"), make_ca(folder, "other-ca")
    server_san = "DNS:localhost,IP:127.0.0.1"
    leader = make_leaf(folder, "leader", ca, 0x1001, server_san, "serverAuth")
    other_leader = make_leaf(folder, "other-leader", other, 0x2001, server_san, "serverAuth")
    workers = {
        "n_alpha": make_leaf(folder, "n_alpha", ca, 0x0A01, node_san("n_alpha"), "clientAuth"),
        "n_beta": make_leaf(folder, "n_beta", ca, 0x0A02, node_san("n_beta"), "clientAuth"),
        "n_gone": make_leaf(folder, "n_gone", ca, 0x0A03, node_san("n_gone"), "clientAuth"),
    }
    other_workers = {"n_delta": make_leaf(folder, "n_delta", other, 0x0B01, node_san("n_delta"), "clientAuth")}
    no_node = make_leaf(folder, "no-node", ca, 0x0A09, "DNS:worker.example", "clientAuth")
    return Certs(ca, other, leader, other_leader, workers, other_workers, no_node)
