"""Security settings of a connection: the client's (kafka-python's names) and a listener's (Kafka's).

Clients — workers, the CLI, ``app.query`` — take :class:`ClientSecurity`, with the names
kafka-python uses (``security_protocol``, ``ssl_cafile``, ``sasl_mechanism``,
``sasl_plain_username``, ...), so the same values configure pystreams' own connections to the
coordinator and kafka-python's connections to the brokers (``kafka_python_config``).

The coordinator's listener takes :class:`ListenerSecurity`, with Kafka's names: a listener is
``PROTOCOL://HOST:PORT`` (``listeners``), TLS has ``ssl.client.auth`` none|requested|required,
and SASL has ``sasl.enabled.mechanisms``. TLS is Python's ``ssl`` (OpenSSL), never our own.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pystreams.protocol.sasl import MECHANISMS, CredentialStore

PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL = "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"
SECURITY_PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
CLIENT_AUTH = ("none", "requested", "required")


def uses_tls(protocol: str) -> bool:
    return protocol in (SSL, SASL_SSL)


def uses_sasl(protocol: str) -> bool:
    return protocol in (SASL_PLAINTEXT, SASL_SSL)


# --- clients -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientSecurity:
    security_protocol: str = PLAINTEXT
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = None
    ssl_check_hostname: bool = True
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"security_protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, got {self.security_protocol!r}")
        if uses_sasl(self.security_protocol):
            if self.sasl_mechanism not in MECHANISMS:
                raise ValueError(f"{self.security_protocol} needs sasl_mechanism {' or '.join(MECHANISMS)}, got {self.sasl_mechanism!r}")
            if not self.sasl_plain_username or self.sasl_plain_password is None:
                raise ValueError(f"SASL/{self.sasl_mechanism} needs sasl_plain_username and sasl_plain_password")

    @property
    def tls(self) -> bool:
        return uses_tls(self.security_protocol)

    @property
    def sasl(self) -> bool:
        return uses_sasl(self.security_protocol)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context (server verified against ``ssl_cafile`` or the system's CAs)."""
        if not self.tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ssl_cafile)
        context.check_hostname = self.ssl_check_hostname
        if self.ssl_certfile:
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, self.ssl_password)
        return context

    def sasl_mechanism_for(self, host: str) -> Any:
        """kafka-python's client side of the mechanism (its SCRAM and PLAIN implementations)."""
        from kafka.net.sasl import get_sasl_mechanism

        return get_sasl_mechanism(self.sasl_mechanism)(host=host, **self.kafka_python_config())

    def kafka_python_config(self) -> dict[str, Any]:
        """Keyword arguments for kafka-python's consumers, producers and admin clients."""
        config: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.tls:
            config.update(
                ssl_cafile=self.ssl_cafile,
                ssl_certfile=self.ssl_certfile,
                ssl_keyfile=self.ssl_keyfile,
                ssl_password=self.ssl_password,
                ssl_check_hostname=self.ssl_check_hostname,
            )
        if self.sasl:
            config.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_plain_username, sasl_plain_password=self.sasl_plain_password)
        return config


# --- a listener ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Listener:
    """``PROTOCOL://HOST:PORT`` (Kafka's ``listeners``); a bare ``HOST:PORT`` is PLAINTEXT."""

    protocol: str
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Listener:
        protocol, sep, address = text.strip().partition("://")
        if not sep:
            protocol, address = PLAINTEXT, text.strip()
        protocol = protocol.upper()
        if protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"listener {text!r}: the protocol must be one of {', '.join(SECURITY_PROTOCOLS)}")
        host, colon, port = address.rpartition(":")
        if not colon or not port.isascii() or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"listener {text!r}: expected [PROTOCOL://]HOST:PORT")
        return cls(protocol, host.strip("[]") or "0.0.0.0", int(port))

    def __str__(self) -> str:
        return f"{self.protocol}://{self.host}:{self.port}"


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ListenerSecurity:
    protocol: str = PLAINTEXT
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = None
    #: CA bundle that client certificates must chain to (mTLS).
    ssl_cafile: str | None = None
    ssl_client_auth: str = "none"
    sasl_enabled_mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
    credentials: CredentialStore | None = None

    def __post_init__(self) -> None:
        if self.protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"unknown security protocol {self.protocol!r}")
        if uses_tls(self.protocol) and not self.ssl_certfile:
            raise ValueError(f"a {self.protocol} listener needs a server certificate (--ssl-certfile, --ssl-keyfile)")
        if self.ssl_client_auth not in CLIENT_AUTH:
            raise ValueError(f"ssl.client.auth must be one of {', '.join(CLIENT_AUTH)}, got {self.ssl_client_auth!r}")
        if self.ssl_client_auth != "none" and not self.ssl_cafile:
            raise ValueError("ssl.client.auth needs --ssl-cafile: the CAs client certificates must chain to")
        if uses_sasl(self.protocol):
            unknown = [m for m in self.sasl_enabled_mechanisms if m not in MECHANISMS]
            if unknown or not self.sasl_enabled_mechanisms:
                raise ValueError(f"sasl.enabled.mechanisms must be among {', '.join(MECHANISMS)}, got {', '.join(self.sasl_enabled_mechanisms) or 'none'}")
            if self.credentials is None:
                raise ValueError(f"a {self.protocol} listener needs credentials (--sasl-credentials-file or PYSTREAMS_SASL_CREDENTIALS)")

    @property
    def tls(self) -> bool:
        return uses_tls(self.protocol)

    @property
    def sasl(self) -> bool:
        return uses_sasl(self.protocol)

    @property
    def authenticates(self) -> bool:
        """Whether clients prove who they are (SASL, or TLS with a required client certificate)."""
        return self.sasl or (self.tls and self.ssl_client_auth == "required")

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.ssl_cafile)
        assert self.ssl_certfile is not None  # __post_init__ requires it with TLS
        context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, self.ssl_password)
        context.verify_mode = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}[self.ssl_client_auth]
        return context


def credentials_from(file: str | None, environ: Mapping[str, str] | None = None) -> CredentialStore | None:
    """SASL credentials: from ``file``, else from PYSTREAMS_SASL_CREDENTIALS (the JSON itself, as a
    Kubernetes Secret would hand it over), else None."""
    environ = os.environ if environ is None else environ
    if file:
        return CredentialStore.load(file)
    inline = environ.get("PYSTREAMS_SASL_CREDENTIALS")
    return CredentialStore.loads(inline, "PYSTREAMS_SASL_CREDENTIALS") if inline else None


def principal_from_certificate(peercert: dict[str, Any] | None) -> str | None:
    """Kafka's default SSL principal: the subject's distinguished name (RFC 2253 order)."""
    if not peercert or not peercert.get("subject"):
        return None
    names = {
        "commonName": "CN",
        "organizationName": "O",
        "organizationalUnitName": "OU",
        "countryName": "C",
        "localityName": "L",
        "stateOrProvinceName": "ST",
        "domainComponent": "DC",
        "emailAddress": "EMAILADDRESS",
    }
    parts = []
    for rdn in reversed(peercert["subject"]):
        parts.append("+".join(f"{names.get(key, key)}={_escape_dn(value)}" for key, value in rdn))
    return "User:" + ",".join(parts)


def _escape_dn(value: str) -> str:
    out = value
    for char in ("\\", ",", "+", '"', "<", ">", ";", "="):
        out = out.replace(char, "\\" + char)
    return out
