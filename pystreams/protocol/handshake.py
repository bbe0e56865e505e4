"""What a pystreams client says first on a new connection, sans-IO: ApiVersions, then SASL.

``client_handshake`` is a generator both wire clients drive (the blocking tools client and the
asyncio member driver): it yields ``(request, version)`` for the caller to send and is sent each
response back; it returns a :class:`ServerInfo`. So the exchange is written once:

1. ApiVersions at the newest version, falling back to the one the server names when it answers
   UNSUPPORTED_VERSION (Kafka's rule). The answer tells a pystreams coordinator (it serves the
   KIP-848 client-side assignment APIs) from a plain Kafka broker, so a client pointed at the
   wrong address can say so instead of timing out.
2. With SASL: SaslHandshake v1 naming the mechanism, then SaslAuthenticate with the tokens of
   kafka-python's own client mechanisms (PLAIN, SCRAM-SHA-256/512) until they are done.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import kafka.errors as Errors
from kafka.protocol.api_message import ApiMessage

from pystreams.protocol import messages as m
from pystreams.protocol.registry import API_VERSIONS_KEY, api_spec, client_api_spec
from pystreams.protocol.security import ClientSecurity

CLIENT_SOFTWARE_NAME = "pystreams"
CLIENT_SOFTWARE_VERSION = "0"

Handshake = Generator[tuple[ApiMessage, int], ApiMessage, "ServerInfo"]


class HandshakeError(Exception):
    """The server refused the connection's set-up (ApiVersions or SASL); the message says why."""


class AuthenticationFailed(HandshakeError):
    pass


@dataclass(frozen=True)
class ServerInfo:
    #: api key -> (min, max) the server advertised.
    versions: dict[int, tuple[int, int]]

    @property
    def is_pystreams_coordinator(self) -> bool:
        """A pystreams coordinator serves ConsumerGroupPrepareAssignment; a Kafka broker does not."""
        return m.ConsumerGroupPrepareAssignmentRequest.API_KEY in self.versions

    def version_for(self, api_key: int) -> int | None:
        """The newest version both sides speak, or None."""
        spec = client_api_spec(api_key)
        if spec is None or api_key not in self.versions:
            return None
        low, high = self.versions[api_key]
        low, high = max(low, spec.min_version), min(high, spec.max_version)
        return high if low <= high else None


def client_handshake(security: ClientSecurity, host: str) -> Handshake:
    spec = api_spec(API_VERSIONS_KEY)
    assert spec is not None
    response = yield m.ApiVersionsRequest(client_software_name=CLIENT_SOFTWARE_NAME, client_software_version=CLIENT_SOFTWARE_VERSION), spec.max_version
    if response.error_code == Errors.UnsupportedVersionError.errno:
        advertised = {row.api_key: row.max_version for row in response.api_keys}
        response = yield m.ApiVersionsRequest(), min(spec.max_version, advertised.get(API_VERSIONS_KEY, 0))
    if response.error_code:
        raise HandshakeError(f"ApiVersions failed: {Errors.for_code(response.error_code).__name__}")
    info = ServerInfo({row.api_key: (row.min_version, row.max_version) for row in response.api_keys})
    if security.sasl:
        yield from _sasl(security, host, info)
    return info


def _sasl(security: ClientSecurity, host: str, info: ServerInfo) -> Generator[tuple[ApiMessage, int], ApiMessage, None]:
    handshake_version = info.version_for(m.SaslHandshakeRequest.API_KEY)
    authenticate_version = info.version_for(m.SaslAuthenticateRequest.API_KEY)
    if handshake_version is None or authenticate_version is None:
        raise HandshakeError("the server does not offer SASL (is its listener SASL_PLAINTEXT or SASL_SSL?)")
    response = yield m.SaslHandshakeRequest(mechanism=security.sasl_mechanism), handshake_version
    if response.error_code:
        raise AuthenticationFailed(
            f"SaslHandshake: {Errors.for_code(response.error_code).__name__}; the server offers {', '.join(response.mechanisms or []) or 'nothing'}"
        )
    mechanism = security.sasl_mechanism_for(host)
    while not mechanism.is_done():
        response = yield m.SaslAuthenticateRequest(auth_bytes=mechanism.auth_bytes()), authenticate_version
        if response.error_code:
            raise AuthenticationFailed(
                f"SASL/{security.sasl_mechanism} as {security.sasl_plain_username!r}: {response.error_message or Errors.for_code(response.error_code).__name__}"
            )
        try:
            mechanism.receive(response.auth_bytes)
        except Exception as error:  # the server's proof did not check out (SCRAM)
            raise AuthenticationFailed(f"SASL/{security.sasl_mechanism}: the server's answer does not verify: {error}") from None
    if not mechanism.is_authenticated():
        raise AuthenticationFailed(f"SASL/{security.sasl_mechanism} as {security.sasl_plain_username!r} was not accepted")
