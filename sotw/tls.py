"""Certificates for a secured local Kafka: a CA of its own, and keys with certificates that CA signs.

A secured ``sotw broker`` makes its TLS material at start with the ``cryptography`` package: a local CA (PEM),
and per node a key and a certificate valid for ``127.0.0.1`` and ``localhost``, written as the PKCS12 keystore
the Java broker reads. Clients trust the CA's PEM (librdkafka's ``ssl.ca.location``, the Java client's
``ssl.truststore.type=PEM``). Files holding a key or a password are written with ``write_private`` (mode
0600 from the moment they exist).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Days a node's or a user's certificate is valid; a CA lives ten times as long.
DEFAULT_DAYS = 365

#: The names every local certificate is valid for: what clients on this machine connect to.
LOOPBACK = ("127.0.0.1", "localhost")


def write_private(path: Path, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` readable by its owner alone (mode 0600), never visible with wider rights.

    The file is created with mode 0600 (and an existing one set to it before it is truncated), so a password
    or key is not readable by others even for a moment.
    """
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, raw)
    finally:
        os.close(fd)
    return path


def new_secret(nbytes: int = 24) -> str:
    """A random password: URL-safe base64 (letters, digits, ``-`` and ``_``).

    No comma, quote, backslash or space, so it goes unquoted into Kafka's ``--add-scram`` argument (split on
    commas), a JAAS option and a ``.properties`` line alike.
    """
    return secrets.token_urlsafe(nbytes)


def _subject(common_name: str) -> x509.Name:
    # A subject of one CN: the principal Kafka derives from it (the DN) is then exactly "CN=<name>".
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):  # once each, in order
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


@dataclass(frozen=True)
class PemFiles:
    """A certificate, its key and the CA that signed it, as PEM files.

    Attributes
    ----------
    cert
        The certificate.
    key
        Its private key (unencrypted PKCS8, mode 0600).
    ca
        The PEM of the CA that signed it: what a client or broker trusting this certificate's issuer trusts.
    """

    cert: Path
    key: Path
    ca: Path


@dataclass(frozen=True)
class Certificate:
    """A certificate and its private key, in memory.

    Attributes
    ----------
    cert
        The X.509 certificate.
    key
        Its private key (EC P-256).
    """

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def common_name(self) -> str:
        """The subject's CN."""
        return str(self.cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)

    @property
    def subject(self) -> str:
        """The subject as a distinguished name (``CN=...``): Kafka's principal name for it over TLS."""
        return self.cert.subject.rfc4514_string()

    @property
    def not_after(self) -> dt.datetime:
        """The end of its validity (UTC)."""
        return self.cert.not_valid_after_utc

    def cert_pem(self) -> bytes:
        """The certificate as PEM."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        """The private key as unencrypted PKCS8 PEM (keep it in a 0600 file)."""
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def write_pem(self, cert: Path, key: Path, ca: Path) -> PemFiles:
        """Write the certificate (0644) and its key (0600); ``ca`` names the signer's PEM already written."""
        cert.write_bytes(self.cert_pem())
        write_private(key, self.key_pem())
        return PemFiles(cert, key, ca)

    def write_pkcs12(self, path: Path, password: str) -> Path:
        """Write key and certificate as a PKCS12 keystore (mode 0600) that Java 17 opens with ``password``.

        PBES2 with AES-256 and an HMAC-SHA256 integrity check: what Java's PKCS12 keystore writes itself
        since JDK 12 (and reads since 11.0.12).
        """
        encryption = (
            serialization.PrivateFormat.PKCS12.encryption_builder()
            .kdf_rounds(10_000)
            .key_cert_algorithm(pkcs12.PBES.PBESv2SHA256AndAES256CBC)
            .hmac_hash(hashes.SHA256())
            .build(password.encode())
        )
        data = pkcs12.serialize_key_and_certificates(
            self.common_name.encode(), self.key, self.cert, None, encryption
        )
        return write_private(path, data)


class CertificateAuthority:
    """A local certificate authority that signs node, user and test certificates.

    Parameters
    ----------
    certificate
        The CA's own (self-signed) certificate and key.
    """

    def __init__(self, certificate: Certificate) -> None:
        self.certificate = certificate

    @classmethod
    def create(
        cls, name: str = "sotw local CA", days: int = 10 * DEFAULT_DAYS, now: dt.datetime | None = None
    ) -> CertificateAuthority:
        """A new CA named ``name``, valid ``days`` days from ``now`` (the current time by default)."""
        start = now or dt.datetime.now(dt.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        public = key.public_key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_subject(name))
            .issuer_name(_subject(name))
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start - dt.timedelta(minutes=5))
            .not_valid_after(start + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(Certificate(cert, key))

    @classmethod
    def load(cls, cert: Path, key: Path) -> CertificateAuthority:
        """The CA saved in ``cert`` and ``key`` (PEM)."""
        certificate = x509.load_pem_x509_certificate(cert.read_bytes())
        private = serialization.load_pem_private_key(key.read_bytes(), password=None)
        if not isinstance(private, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key} does not hold an EC private key")
        return cls(Certificate(certificate, private))

    def save(self, cert: Path, key: Path) -> None:
        """Write the CA's certificate (0644, what clients trust) and its key (0600)."""
        cert.write_bytes(self.certificate.cert_pem())
        write_private(key, self.certificate.key_pem())

    @property
    def pem(self) -> bytes:
        """The CA's certificate as PEM."""
        return self.certificate.cert_pem()

    def issue(
        self,
        common_name: str,
        hosts: Iterable[str] = (),
        days: int = DEFAULT_DAYS,
        expired: bool = False,
        now: dt.datetime | None = None,
    ) -> Certificate:
        """A new key and a certificate for ``common_name`` signed by this CA.

        Parameters
        ----------
        common_name
            The subject's CN (a node's, or a user's: over TLS, Kafka's principal is ``User:CN=<name>``).
        hosts
            Host names and IP addresses it serves as (its SubjectAltNames); empty for a client certificate.
        days
            Days of validity from ``now``.
        expired
            Valid for a day that ended an hour before ``now`` (for tests of a client refusing it).
        now
            The time to date it from; the current time by default.
        """
        start = now or dt.datetime.now(dt.UTC)
        if expired:
            not_before, not_after = start - dt.timedelta(days=1, hours=1), start - dt.timedelta(hours=1)
        else:
            not_before, not_after = start - dt.timedelta(minutes=5), start + dt.timedelta(days=days)
        ca = self.certificate
        key = ec.generate_private_key(ec.SECP256R1())
        public = key.public_key()
        ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        builder = (
            x509.CertificateBuilder()
            .subject_name(_subject(common_name))
            .issuer_name(ca.cert.subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=True,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            # A node is a TLS server to clients and a TLS client to the other nodes.
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
            )
        )
        names = list(hosts)
        if names:
            builder = builder.add_extension(_san(names), critical=False)
        return Certificate(builder.sign(ca.key, hashes.SHA256()), key)


def server_hosts(host: str) -> tuple[str, ...]:
    """The SubjectAltNames of a node bound to ``host``: ``LOOPBACK``, and ``host`` if it is another name."""
    return tuple(dict.fromkeys((*LOOPBACK, host)))
