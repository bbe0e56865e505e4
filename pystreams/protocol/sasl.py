"""SASL on the server side, sans-IO: PLAIN and SCRAM-SHA-256/512, and the credentials they check.

Kafka's exchange (KIP-43, KIP-152): after ApiVersions, the client names a mechanism in
SaslHandshake (v1), then sends the mechanism's tokens in SaslAuthenticate requests until the
mechanism is done; nothing else is served on the connection before that. :class:`SaslServer`
is that exchange for one connection: ``handshake(mechanism)`` then ``authenticate(token)``
until it reports the principal, or an error after which the connection is closed.

SCRAM is done by ``scramp`` (a well-kept implementation of RFC 5802/7677), not by us.
Credentials are stored as SCRAM keeps them — salt, iteration count, StoredKey and ServerKey,
never the password (:class:`CredentialStore`, a JSON document in a file or an environment
variable, written by ``pystreams credentials``). PLAIN checks a password against the same salted
keys, so one store serves both mechanisms.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import kafka.errors as Errors

# scramp (and the asn1crypto it pulls in) loads only where SCRAM runs — the coordinator's
# server and ``pystreams credentials`` — not in every worker that imports this module's
# names through the client's security settings (a tenth of a second of each worker start).

PLAIN = "PLAIN"
SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
SCRAM_MECHANISMS = (SCRAM_SHA_256, SCRAM_SHA_512)
MECHANISMS = (PLAIN, *SCRAM_MECHANISMS)
#: Kafka's minimum SCRAM iteration count.
MIN_ITERATIONS = 4096
_HASHES = {SCRAM_SHA_256: hashlib.sha256, SCRAM_SHA_512: hashlib.sha512}


class CredentialError(ValueError):
    """A credential document that cannot be used, with the reason."""


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_json(self) -> dict[str, object]:
        b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
        return {"salt": b64(self.salt), "stored_key": b64(self.stored_key), "server_key": b64(self.server_key), "iterations": self.iterations}

    @classmethod
    def from_json(cls, data: Mapping[str, object], where: str) -> ScramCredential:
        try:
            credential = cls(
                salt=base64.b64decode(str(data["salt"]), validate=True),
                stored_key=base64.b64decode(str(data["stored_key"]), validate=True),
                server_key=base64.b64decode(str(data["server_key"]), validate=True),
                iterations=int(str(data["iterations"])),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise CredentialError(f"{where}: needs salt, stored_key, server_key (base64) and iterations: {error}") from None
        if credential.iterations < MIN_ITERATIONS:
            raise CredentialError(f"{where}: iterations must be at least {MIN_ITERATIONS}")
        return credential


@dataclass(frozen=True)
class CredentialStore:
    """user -> mechanism -> SCRAM credential."""

    users: Mapping[str, Mapping[str, ScramCredential]] = field(default_factory=dict)

    @classmethod
    def loads(cls, text: str, source: str = "credentials") -> CredentialStore:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            raise CredentialError(f"{source} is not JSON: {error}") from None
        users = document.get("users") if isinstance(document, dict) else None
        if not isinstance(users, dict):
            raise CredentialError(f'{source} must be {{"users": {{USER: {{MECHANISM: {{...}}}}}}}}')
        parsed: dict[str, dict[str, ScramCredential]] = {}
        for user, mechanisms in users.items():
            if not isinstance(mechanisms, dict) or not mechanisms:
                raise CredentialError(f"{source}: user {user!r} has no credentials")
            for mechanism, data in mechanisms.items():
                if mechanism not in SCRAM_MECHANISMS or not isinstance(data, dict):
                    raise CredentialError(f"{source}: user {user!r}: unknown mechanism {mechanism!r} (expected {', '.join(SCRAM_MECHANISMS)})")
                parsed.setdefault(user, {})[mechanism] = ScramCredential.from_json(data, f"{source}: user {user!r} {mechanism}")
        return cls(parsed)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CredentialStore:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise CredentialError(f"cannot read the credentials file {path}: {error.strerror}") from None
        return cls.loads(text, str(path))

    def dumps(self) -> str:
        return (
            json.dumps(
                {"users": {user: {mech: cred.to_json() for mech, cred in sorted(mechs.items())} for user, mechs in sorted(self.users.items())}}, indent=2
            )
            + "\n"
        )

    def with_user(self, user: str, password: str, *, iterations: int = MIN_ITERATIONS, mechanisms: Iterable[str] = SCRAM_MECHANISMS) -> CredentialStore:
        """A copy with ``user``'s credentials (re)made from ``password``."""
        if not user:
            raise CredentialError("the user name must be non-empty")
        if iterations < MIN_ITERATIONS:
            raise CredentialError(f"iterations must be at least {MIN_ITERATIONS}")
        from scramp import ScramMechanism

        made = {}
        for mechanism in mechanisms:
            salt, stored_key, server_key, count = ScramMechanism(mechanism).make_auth_info(password, iteration_count=iterations)
            made[mechanism] = ScramCredential(salt, stored_key, server_key, count)
        users = {name: dict(mechs) for name, mechs in self.users.items()}
        users[user] = made
        return CredentialStore(users)

    def scram(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.users.get(user, {}).get(mechanism)

    def check_password(self, user: str, password: str) -> bool:
        """PLAIN: the password salted as the stored SCRAM credential was, compared in constant time."""
        mechanisms = self.users.get(user)
        if not mechanisms:
            return False
        mechanism, credential = max(mechanisms.items())  # the strongest hash the user has
        digest = _HASHES[mechanism]
        salted = hashlib.pbkdf2_hmac(digest().name, password.encode("utf-8"), credential.salt, credential.iterations)
        client_key = hmac.new(salted, b"Client Key", digest).digest()
        return hmac.compare_digest(digest(client_key).digest(), credential.stored_key)


class _Stage(enum.Enum):
    HANDSHAKE = "handshake"
    AUTHENTICATE = "authenticate"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class AuthStep:
    """One SaslAuthenticate answer: bytes for the client, and the principal once authenticated."""

    error_code: int = 0
    error_message: str | None = None
    auth_bytes: bytes = b""
    principal: str | None = None


class SaslServer:
    """One connection's SASL exchange."""

    def __init__(self, mechanisms: Iterable[str], credentials: CredentialStore) -> None:
        self.mechanisms = tuple(mechanisms)
        self._credentials = credentials
        self._stage = _Stage.HANDSHAKE
        self._mechanism: str | None = None
        self._scram = None
        self._scram_user: str | None = None
        self.principal: str | None = None

    @property
    def authenticated(self) -> bool:
        return self._stage is _Stage.DONE

    def handshake(self, mechanism: str) -> int:
        """SaslHandshake: 0, or UNSUPPORTED_SASL_MECHANISM / ILLEGAL_SASL_STATE."""
        if self._stage is not _Stage.HANDSHAKE:
            self._stage = _Stage.FAILED
            return Errors.IllegalSaslStateError.errno
        if mechanism not in self.mechanisms:
            return Errors.UnsupportedSaslMechanismError.errno
        self._mechanism = mechanism
        self._stage = _Stage.AUTHENTICATE
        if mechanism in SCRAM_MECHANISMS:
            from scramp import ScramMechanism

            self._scram = ScramMechanism(mechanism).make_server(self._scram_auth_info)
        return 0

    def authenticate(self, token: bytes) -> AuthStep:
        from scramp import ScramException

        if self._stage is not _Stage.AUTHENTICATE:
            self._stage = _Stage.FAILED
            return AuthStep(Errors.IllegalSaslStateError.errno, "SaslAuthenticate outside an exchange")
        try:
            if self._mechanism == PLAIN:
                return self._plain(token)
            return self._scram_step(token)
        except (ScramException, UnicodeDecodeError, ValueError):
            self._stage = _Stage.FAILED
            return AuthStep(
                Errors.SaslAuthenticationFailedError.errno,
                f"Authentication failed during authentication due to invalid credentials with SASL mechanism {self._mechanism}",
            )

    def _plain(self, token: bytes) -> AuthStep:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise ValueError("a PLAIN token is authzid NUL authcid NUL password")
        authzid, user, password = (part.decode("utf-8") for part in parts)
        if authzid and authzid != user:
            raise ValueError("PLAIN authorization id must be empty or the user")
        if not self._credentials.check_password(user, password):
            raise ValueError("wrong user or password")
        return self._done(user, b"")

    def _scram_step(self, token: bytes) -> AuthStep:
        assert self._scram is not None
        message = token.decode("utf-8")
        if self._scram.stage is None:
            self._scram.set_client_first(message)
            return AuthStep(auth_bytes=self._scram.get_server_first().encode("utf-8"))
        self._scram.set_client_final(message)
        return self._done(self._scram_user or "", self._scram.get_server_final().encode("utf-8"))

    def _scram_auth_info(self, user: str):
        self._scram_user = user  # scramp names the user only to this callback
        credential = self._credentials.scram(user, self._mechanism or "")
        if credential is None:
            from scramp import ScramException

            raise ScramException("unknown user")
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations

    def _done(self, user: str, auth_bytes: bytes) -> AuthStep:
        self._stage = _Stage.DONE
        self.principal = f"User:{user}"
        return AuthStep(auth_bytes=auth_bytes, principal=self.principal)
