"""A secured local broker: each ``--security`` mode's listeners, its nodes' TLS and SCRAM settings, its admin.

``SecurityMode`` says, once per mode, what the ``CLIENT``, ``INTERNAL`` and ``CONTROLLER`` listeners speak and who
the principals are. ``BrokerSecrets`` makes and keeps what a secured broker needs on disk, in its data
directory: a local CA, a keystore per node, the admin's password and its client settings file. Users that
hold only a run's ACLs are made in ``sotw.broker.users``. docs/broker.md says where each file is and why.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sotw.errors import BrokerError
from sotw.kafka import read_settings, settings_text
from sotw.tls import Certificate, CertificateAuthority, PemFiles, new_secret, server_hosts, write_private

#: The ``--security`` modes, the default first.
SECURITY_MODES = ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")

#: The one SASL mechanism a secured broker enables.
MECHANISM = "SCRAM-SHA-512"

#: Iterations of a SCRAM credential sotw creates: Kafka's own default for ``--add-scram``.
SCRAM_ITERATIONS = 4096

#: The super user created at format time (SASL modes) or given a client certificate (``ssl``).
ADMIN = "admin"

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"

#: Settings of a secured broker that an override would break (the nodes cut off from each other, the admin
#: out): refused in ``KafkaBrokerConfig.overrides`` unless the broker is plaintext.
SECURED_OWNED = (
    "super.users",
    "sasl.enabled.mechanisms",
    "sasl.mechanism.inter.broker.protocol",
    "sasl.mechanism.controller.protocol",
    "ssl.keystore.type",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.key.password",
    "ssl.truststore.type",
    "ssl.truststore.location",
    "ssl.truststore.password",
    "ssl.principal.mapping.rules",
    "principal.builder.class",
)

#: What the names of users sotw makes may hold: a CN and a SCRAM user name alike, without quoting.
_USER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class SecurityMode:
    """One ``--security`` mode: the protocol its client and inter-broker listeners speak, and its principals.

    Attributes
    ----------
    name
        As ``--security`` takes it.
    protocol
        Kafka's security protocol of the ``CLIENT`` and ``INTERNAL`` listeners.
    tls
        Clients connect over TLS.
    sasl
        Clients log in with SCRAM-SHA-512; without it (``ssl``), a client certificate is the identity.
    """

    name: str
    protocol: str
    tls: bool
    sasl: bool

    @property
    def secured(self) -> bool:
        """Anything but plaintext: TLS material, an authorizer and an admin."""
        return self.tls or self.sasl

    @property
    def controller_protocol(self) -> str:
        """The ``CONTROLLER`` listener's protocol: TLS with client certificates whenever the broker is secured.

        Not SCRAM: controllers would check SCRAM logins against credentials kept in the very metadata log they
        are electing a leader for, and Kafka does not support SCRAM between controllers (KAFKA-15513); a
        node's certificate is its identity there instead.
        """
        return "SSL" if self.secured else "PLAINTEXT"

    @property
    def internal_protocol(self) -> str:
        """The ``INTERNAL`` listener's protocol (replication): the clients' one, over TLS whenever secured.

        ``sasl_plaintext`` leaves TLS to the clients, not to the nodes: they replicate over ``SASL_SSL``.
        """
        if not self.secured:
            return "PLAINTEXT"
        return "SASL_SSL" if self.sasl else "SSL"

    @property
    def listener_map(self) -> str:
        """``listener.security.protocol.map`` for the three listeners."""
        return (
            f"CLIENT:{self.protocol},INTERNAL:{self.internal_protocol},CONTROLLER:{self.controller_protocol}"
        )

    def principal(self, user: str) -> str:
        """Kafka's principal for ``user``: ``User:<name>`` logged in with SCRAM, ``User:CN=<name>`` by certificate.

        Over TLS alone the principal is the client certificate's distinguished name, and sotw's certificates
        have a subject of one CN.
        """
        return f"User:{user}" if self.sasl else f"User:CN={user}"


MODES: dict[str, SecurityMode] = {
    "plaintext": SecurityMode("plaintext", "PLAINTEXT", tls=False, sasl=False),
    "ssl": SecurityMode("ssl", "SSL", tls=True, sasl=False),
    "sasl_plaintext": SecurityMode("sasl_plaintext", "SASL_PLAINTEXT", tls=False, sasl=True),
    "sasl_ssl": SecurityMode("sasl_ssl", "SASL_SSL", tls=True, sasl=True),
}


def security_mode(name: str) -> SecurityMode:
    """The mode called ``name``.

    Raises
    ------
    BrokerError
        Naming the modes there are.
    """
    try:
        return MODES[name]
    except (KeyError, TypeError):
        raise BrokerError(f"security must be one of {', '.join(SECURITY_MODES)}, got {name!r}") from None


def node_name(node: int) -> str:
    """The CN of node ``node``'s certificate; its principal on TLS listeners is ``User:CN=<this>``."""
    return f"sotw-node-{node}"


def check_user_name(name: str) -> str:
    """``name`` if sotw can make a user of it (letters, digits, ``.``, ``_``, ``-``; not admin's or a node's).

    Raises
    ------
    BrokerError
        Naming the rule.
    """
    if not isinstance(name, str) or not _USER.fullmatch(name):
        raise BrokerError(
            f"user name must be 1-64 letters, digits, '.', '_' or '-' (not first), got {name!r}"
        )
    if name == ADMIN or name.startswith("sotw-node-"):
        raise BrokerError(f"user name {name!r} is taken by the broker itself; choose another")
    return name


def _jaas(username: str | None = None, password: str | None = None) -> str:
    if username is None:
        return f"{SCRAM_LOGIN} required;"
    return f'{SCRAM_LOGIN} required username="{username}" password="{password}";'


def security_properties(
    mode: SecurityMode,
    node_ids: Iterable[int],
    keystore: Path,
    keystore_password: str,
    truststore: Path,
    admin_password: str,
) -> dict[str, str]:
    """The ``server.properties`` settings that secure one node (none for plaintext).

    Parameters
    ----------
    mode
        The broker's mode.
    node_ids
        Every node of the cluster: each one's certificate principal is a super user.
    keystore, keystore_password
        The node's PKCS12 keystore and its password.
    truststore
        The CA's PEM.
    admin_password
        The admin's SCRAM password: the nodes log in with it on ``INTERNAL`` (SASL modes).
    """
    if not mode.secured:
        return {}
    supers = [mode.principal(ADMIN), *(f"User:CN={node_name(n)}" for n in sorted(node_ids))]
    props = {
        "authorizer.class.name": AUTHORIZER,
        # ';' separates them: a certificate's DN may hold commas.
        "super.users": ";".join(supers),
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(keystore),
        "ssl.keystore.password": keystore_password,
        "ssl.key.password": keystore_password,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(truststore),
        # Nodes prove who they are to each other's controllers with their certificates.
        "listener.name.controller.ssl.client.auth": "required",
    }
    if not mode.sasl:
        # TLS alone: the client certificate is the identity, on the clients' listener and between nodes.
        props["listener.name.client.ssl.client.auth"] = "required"
        props["listener.name.internal.ssl.client.auth"] = "required"
        return props
    jaas = f"{MECHANISM.lower()}.sasl.jaas.config"
    props |= {
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        # Every SASL listener needs a login section; the server side of SCRAM checks the credentials kept in
        # the cluster's metadata, so the clients' listener's is empty.
        f"listener.name.client.{jaas}": _jaas(),
        # The nodes replicate as admin, as Kafka's own SCRAM example does: a super user the cluster has from
        # its first start (created at format time).
        f"listener.name.internal.{jaas}": _jaas(ADMIN, admin_password),
    }
    return props


def client_settings(
    mode: SecurityMode,
    ca: Path,
    username: str | None = None,
    password: str | None = None,
    certificate: PemFiles | None = None,
) -> dict[str, str]:
    """The librdkafka settings of a client of a ``mode`` broker: SCRAM login and/or TLS trust and certificate."""
    settings: dict[str, str] = {}
    if not mode.secured:
        return settings
    settings["security.protocol"] = mode.protocol
    if mode.sasl:
        settings |= {
            "sasl.mechanisms": MECHANISM,
            "sasl.username": str(username),
            "sasl.password": str(password),
        }
    if mode.tls:
        settings["ssl.ca.location"] = str(ca)
    if not mode.sasl and certificate is not None:
        settings |= {
            "ssl.certificate.location": str(certificate.cert),
            "ssl.key.location": str(certificate.key),
        }
    return settings


class BrokerSecrets:
    """A secured broker's CA, node keystores, admin and users, kept in its data directory.

    Made at every start (``prepare``): the CA is created once per data directory and kept with it, so
    certificates of users made earlier stay valid; each node gets a new key, certificate and keystore
    password at each start, written only in its own ``server.properties`` (mode 0600). The admin's
    password is made once and kept in ``admin.properties`` (mode 0600), the client settings file printed by
    ``sotw broker``; the nodes' copies of it sit in their ``server.properties``.

    Parameters
    ----------
    mode
        The broker's security mode (not plaintext).
    root
        The broker's data directory.
    host
        The address the nodes bind (a SubjectAltName of their certificates besides the loopback names), or
        every node's address when each has its own (``netns``): each node's certificate names them all, so
        a client or a peer verifying the name of whichever node it reached finds it there.
    """

    def __init__(self, mode: SecurityMode, root: Path, host: str | Sequence[str]) -> None:
        self.mode = mode
        self.root = root
        self.hosts = (host,) if isinstance(host, str) else tuple(host)
        self.host = self.hosts[0]
        self.tls_dir = root / "tls"
        self.users_dir = root / "users"
        self.ca_path = self.tls_dir / "ca.pem"
        self.admin_config_path = root / "admin.properties"
        self._ca_key = self.tls_dir / "ca.key"
        self._ca: CertificateAuthority | None = None
        self._admin_password = ""
        self._admin_certificate: PemFiles | None = None

    @property
    def server_hosts(self) -> tuple[str, ...]:
        """The SubjectAltNames of the nodes' certificates: the loopback names and every node's address."""
        return tuple(dict.fromkeys(name for host in self.hosts for name in server_hosts(host)))

    @property
    def ca(self) -> CertificateAuthority:
        """The broker's CA (after ``prepare``)."""
        if self._ca is None:
            raise BrokerError("the broker's TLS material is not made yet: start the broker first")
        return self._ca

    def prepare(self) -> None:
        """Load or make the CA and the admin's credentials; write the admin's client settings file.

        Raises
        ------
        BrokerError
            If a kept data directory lost the admin's password (it is only in ``admin.properties``).
        """
        self.tls_dir.mkdir(parents=True, exist_ok=True)
        if self.ca_path.exists() and self._ca_key.exists():
            self._ca = CertificateAuthority.load(self.ca_path, self._ca_key)
        else:
            self._ca = CertificateAuthority.create(f"sotw local CA {self.root.name}")
            self._ca.save(self.ca_path, self._ca_key)
        if self.mode.sasl:
            self._admin_password = self._saved_admin_password() or new_secret()
        else:
            self._admin_certificate = self.issue(ADMIN)
        write_private(
            self.admin_config_path,
            settings_text(self.admin_settings, f"sotw broker: the super user {ADMIN}'s client settings"),
        )

    def load(self) -> None:
        """Load the CA and the admin's password of a broker started on ``root``, changing no file.

        For another process (``sotw broker add-user``) adding users to a running broker.

        Raises
        ------
        BrokerError
            If ``root`` is not the data directory of a broker started with this mode.
        """
        if not (self.ca_path.exists() and self._ca_key.exists() and self.admin_config_path.exists()):
            raise BrokerError(
                f"{self.root} holds no secured broker's CA and admin settings: give the --kafka-config file "
                "`sotw broker --security ...` printed"
            )
        self._ca = CertificateAuthority.load(self.ca_path, self._ca_key)
        if self.mode.sasl:
            self._admin_password = self._saved_admin_password() or ""

    def _saved_admin_password(self) -> str | None:
        if not self.admin_config_path.exists():
            if (self.root / "node-1" / "data" / "meta.properties").exists():
                raise BrokerError(
                    f"{self.admin_config_path} is gone, and with it the admin's password the cluster in "
                    f"{self.root} was formatted with; delete {self.root} to start afresh"
                )
            return None
        saved = read_settings(self.admin_config_path)
        return saved.get("sasl.password") or None

    @property
    def admin_settings(self) -> dict[str, str]:
        """The admin's librdkafka settings (``security.protocol``, ``sasl.*``, ``ssl.*``)."""
        return client_settings(
            self.mode, self.ca_path, ADMIN, self._admin_password, certificate=self._admin_certificate
        )

    def format_arguments(self) -> list[str]:
        """``StorageTool format`` arguments that create the admin's SCRAM credential (SASL modes).

        They hold the password: the caller passes them in a 0600 argument file, never on a command line.
        """
        if not self.mode.sasl:
            return []
        return ["--add-scram", f"{MECHANISM}=[name={ADMIN},password={self._admin_password}]"]

    def node_properties(self, node: int, node_dir: Path, node_ids: Iterable[int]) -> dict[str, str]:
        """Make node ``node``'s key, certificate and keystore (a new password) and return its settings."""
        password = new_secret()
        keystore = self.ca.issue(node_name(node), self.server_hosts).write_pkcs12(
            node_dir / "keystore.p12", password
        )
        return security_properties(
            self.mode, node_ids, keystore, password, self.ca_path, self._admin_password
        )

    def issue(self, name: str, expired: bool = False, foreign: bool = False) -> PemFiles:
        """A client certificate for CN ``name`` in ``tls/``: by this broker's CA, or by a new CA (``foreign``).

        ``expired`` and ``foreign`` make certificates clients or the broker must refuse (tests of bad TLS);
        ``PemFiles.ca`` is the PEM of the CA that signed it.
        """
        kind = "-expired" if expired else ""
        if foreign:
            stem = self.tls_dir / f"{name}-foreign{kind}"
            other = CertificateAuthority.create(f"another CA for {name}")
            ca = stem.with_name(stem.name + "-ca.pem")
            ca.write_bytes(other.pem)
            cert: Certificate = other.issue(name, self.server_hosts, expired=expired)
        else:
            stem = self.tls_dir / f"{name}{kind}"
            ca = self.ca_path
            cert = self.ca.issue(name, self.server_hosts, expired=expired)
        return cert.write_pem(stem.with_name(stem.name + ".pem"), stem.with_name(stem.name + ".key"), ca)

    def user_settings(self, name: str, password: str | None) -> dict[str, str]:
        """The client settings of user ``name``: its SCRAM login, or a new certificate by the CA (``ssl``)."""
        certificate = None if self.mode.sasl else self.issue(name)
        return client_settings(self.mode, self.ca_path, name, password, certificate=certificate)

    def write_user(self, name: str, settings: Mapping[str, str]) -> Path:
        """Write user ``name``'s client settings file (mode 0600) under ``users/``."""
        self.users_dir.mkdir(exist_ok=True)
        return write_private(
            self.users_dir / f"{name}.properties",
            settings_text(settings, f"sotw broker: the client settings of user {name}"),
        )
