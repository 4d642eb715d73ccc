"""The local CA and its certificates: names, validity, PKCS12 keystores Java opens, and private files."""

from __future__ import annotations

import datetime as dt
import ipaddress
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.serialization import pkcs12

from sotw.tls import CertificateAuthority, new_secret, server_hosts, write_private


def test_private_files_are_the_owners_alone_even_when_they_existed_wider(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, "new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == "new"


def test_secrets_need_no_quoting_in_properties_jaas_or_add_scram() -> None:
    secret = new_secret()
    assert len(secret) >= 32 and not set(secret) & set(',"\\ =[]')


def test_a_node_certificate_names_the_loopback_and_its_host_signed_by_the_ca() -> None:
    ca = CertificateAuthority.create("test CA")
    node = ca.issue("sotw-node-1", server_hosts("127.0.0.2"))
    san = node.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("127.0.0.2"),
    ]
    assert node.subject == "CN=sotw-node-1" and node.cert.issuer == ca.certificate.cert.subject
    node.cert.verify_directly_issued_by(ca.certificate.cert)


def test_an_expired_certificate_ended_before_now() -> None:
    now = dt.datetime.now(dt.UTC)
    cert = CertificateAuthority.create().issue("late", expired=True, now=now)
    assert cert.not_after < now


def test_a_keystore_opens_with_its_password_and_holds_key_and_certificate(tmp_path: Path) -> None:
    node = CertificateAuthority.create().issue("sotw-node-2", server_hosts("127.0.0.1"))
    path = node.write_pkcs12(tmp_path / "keystore.p12", "pw-123")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key, cert, extra = pkcs12.load_key_and_certificates(path.read_bytes(), b"pw-123")
    assert cert == node.cert and key is not None and extra == []


def test_a_saved_ca_loads_back_and_keeps_its_key_private(tmp_path: Path) -> None:
    ca = CertificateAuthority.create()
    ca.save(tmp_path / "ca.pem", tmp_path / "ca.key")
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600
    again = CertificateAuthority.load(tmp_path / "ca.pem", tmp_path / "ca.key")
    assert again.pem == ca.pem
    again.issue("user").cert.verify_directly_issued_by(ca.certificate.cert)
