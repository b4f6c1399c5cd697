"""Which node a verified certificate stands for, under each mode: the rules without a network."""

from __future__ import annotations

import pytest

from opod.http.tls.identity import CertRefused, certificate_identity
from opod.http.tls.peer import PeerCert, TLSConnection, spiffe_node_ids
from opod.http.tls.policy import NodeMtls

CA = "-----BEGIN CERTIFICATE-----\nCA1\n-----END CERTIFICATE-----\n"
ALLOW = NodeMtls("allow", CA, frozenset({"a03"}), enforced=True)
REQUIRE = NodeMtls("require", CA, frozenset(), enforced=True)


def peer(*ids: str, serial: str = "a01", not_after: float = 4e9) -> TLSConnection:
    return TLSConnection(CA, PeerCert(ids, serial, not_after, "CN=w"))


def test_the_spiffe_shape_is_the_only_one_read() -> None:
    assert spiffe_node_ids(
        [
            "spiffe://fleet.example/opod/node/n_1",
            "spiffe://fleet.example/opod/node/n_1",  # twice is once
            "spiffe://fleet.example/workload/n_2",
            "https://fleet.example/opod/node/n_3",
            "spiffe://fleet.example/opod/node/n_4/extra",
            "spiffe://fleet.example/opod/node/",
        ]
    ) == ("n_1",)


def test_peercert_from_the_ssl_module_s_dict() -> None:
    cert = PeerCert.from_peercert(
        {
            "subject": ((("commonName", "w1"),),),
            "serialNumber": "0A01",
            "notAfter": "Dec  1 16:06:59 2026 GMT",
            "subjectAltName": (("DNS", "w1.example"), ("URI", "spiffe://t.example/opod/node/w1")),
        }
    )
    assert (cert.node_ids, cert.serial, cert.subject) == (("w1",), "a01", "commonName=w1")


def test_off_or_unenforced_ignores_the_certificate() -> None:
    assert certificate_identity(NodeMtls(), peer("n1")) is None
    assert certificate_identity(NodeMtls("allow", CA, enforced=False), peer("n1")) is None


def test_allow() -> None:
    assert certificate_identity(ALLOW, peer("n1")) == "n1"
    assert certificate_identity(ALLOW, TLSConnection(CA, None)) is None  # no certificate: the token decides
    assert certificate_identity(ALLOW, None) is None  # not TLS at all
    assert certificate_identity(ALLOW, peer()) is None  # signed by the CA, but not a node certificate


@pytest.mark.parametrize("policy", [ALLOW, REQUIRE])
def test_refusals(policy: NodeMtls) -> None:
    with pytest.raises(CertRefused, match="names several nodes") as err:
        certificate_identity(policy, peer("n1", "n2"))
    assert err.value.status == 403
    stale = TLSConnection(
        "-----BEGIN CERTIFICATE-----\nOLD\n-----END CERTIFICATE-----\n", PeerCert(("n1",), "a01", 4e9)
    )
    with pytest.raises(CertRefused, match="retry on a new connection") as err:
        certificate_identity(policy, stale)
    assert err.value.status == 421
    with pytest.raises(CertRefused, match="expired") as err:
        certificate_identity(policy, peer("n1", not_after=1.0))
    assert err.value.status == 421


def test_a_revoked_serial_is_refused_whatever_its_spelling() -> None:
    with pytest.raises(CertRefused, match="serial a03") as err:
        certificate_identity(ALLOW, peer("n3", serial="a03"))
    assert err.value.status == 403
    assert ALLOW.is_revoked("00:0A:03") and ALLOW.is_revoked(0xA03)


def test_require_refuses_a_certificate_naming_no_node() -> None:
    with pytest.raises(CertRefused, match="names no node"):
        certificate_identity(REQUIRE, peer())
    assert certificate_identity(REQUIRE, TLSConnection(CA, None)) is None  # the handler refuses: no certificate
