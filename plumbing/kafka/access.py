"""How a client reaches Kafka: bootstrap servers, security protocol, SASL principal, TLS files.

One `KafkaAccess` is built from `Settings` (or from the local broker's
credentials) and handed to the client factory (`clients.py`), which is the only
place a producer, consumer or admin client is constructed. A principal is a
separate value so that a later per-tenant principal is `access.as_principal(p)`.
Passwords are `SecretStr`: they print as `**********` in reprs and logs.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, get_args

from pydantic import SecretStr

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
SECURITY_PROTOCOLS: tuple[str, ...] = get_args(SecurityProtocol)
SASL_MECHANISMS: tuple[str, ...] = get_args(SaslMechanism)


class KafkaAccessError(ValueError):
    """A security setting that cannot work (SASL without a principal, a TLS file that is missing)."""


@dataclass(frozen=True)
class KafkaPrincipal:
    """Who a client authenticates as over SASL."""

    username: str
    password: SecretStr
    mechanism: SaslMechanism = "SCRAM-SHA-256"


@dataclass(frozen=True)
class KafkaTls:
    """Files of a TLS connection: the CA that signed the brokers, and the client's own certificate for mTLS."""

    cafile: Path | None = None
    certfile: Path | None = None
    keyfile: Path | None = None

    def context(self) -> ssl.SSLContext:
        for path in (self.cafile, self.certfile, self.keyfile):
            if path is not None and not Path(path).is_file():
                raise KafkaAccessError(f"Kafka TLS file {path} does not exist")
        if self.keyfile is not None and self.certfile is None:
            raise KafkaAccessError("kafka_ssl_keyfile is set without kafka_ssl_certfile")
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                             cafile=str(self.cafile) if self.cafile else None)
        if self.certfile is not None:
            context.load_cert_chain(str(self.certfile), str(self.keyfile) if self.keyfile else None)
        return context


@dataclass(frozen=True)
class KafkaAccess:
    bootstrap: str
    protocol: SecurityProtocol = "PLAINTEXT"
    principal: KafkaPrincipal | None = None
    tls: KafkaTls | None = None

    def __post_init__(self) -> None:
        if self.protocol not in SECURITY_PROTOCOLS:
            raise KafkaAccessError(f"kafka_security_protocol {self.protocol!r} is not one of {SECURITY_PROTOCOLS}")
        if self.uses_sasl and self.principal is None:
            raise KafkaAccessError(f"kafka_security_protocol {self.protocol} needs kafka_sasl_username and "
                                   "kafka_sasl_password")
        if self.principal is not None and self.principal.mechanism not in SASL_MECHANISMS:
            raise KafkaAccessError(f"kafka_sasl_mechanism {self.principal.mechanism!r} is not one of "
                                   f"{SASL_MECHANISMS}")

    @classmethod
    def of(cls, target: "KafkaAccess | str") -> "KafkaAccess":
        """A bare bootstrap string is the unauthenticated PLAINTEXT access of local development."""
        return target if isinstance(target, KafkaAccess) else cls(target)

    @classmethod
    def from_settings(cls, settings, bootstrap: str, password: SecretStr | None = None) -> "KafkaAccess":
        """The access `settings` describe at `bootstrap`; `password` stands in when the settings hold none
        (the local broker's generated credentials)."""
        principal = None
        if settings.kafka_security_protocol.startswith("SASL_"):
            secret = settings.kafka_sasl_password or password
            if not settings.kafka_sasl_username or secret is None:
                raise KafkaAccessError(f"kafka_security_protocol {settings.kafka_security_protocol} needs "
                                       "LEDGERLM_KAFKA_SASL_USERNAME and LEDGERLM_KAFKA_SASL_PASSWORD")
            principal = KafkaPrincipal(settings.kafka_sasl_username, secret, settings.kafka_sasl_mechanism)
        tls = None
        if settings.kafka_security_protocol.endswith("SSL"):
            tls = KafkaTls(settings.kafka_ssl_cafile, settings.kafka_ssl_certfile, settings.kafka_ssl_keyfile)
        return cls(bootstrap, settings.kafka_security_protocol, principal, tls)

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def uses_tls(self) -> bool:
        return self.protocol.endswith("SSL")

    def as_principal(self, principal: KafkaPrincipal) -> "KafkaAccess":
        """The same brokers and transport, authenticated as another principal (a role's, a tenant's)."""
        protocol: SecurityProtocol = "SASL_SSL" if self.uses_tls else "SASL_PLAINTEXT"
        return replace(self, protocol=protocol, principal=principal)

    def client_options(self) -> dict[str, object]:
        """Keyword arguments every aiokafka client takes: where the brokers are and how to authenticate."""
        options: dict[str, object] = {"bootstrap_servers": self.bootstrap, "security_protocol": self.protocol}
        if self.uses_tls:
            options["ssl_context"] = (self.tls or KafkaTls()).context()
        if self.principal is not None and self.uses_sasl:
            options.update(sasl_mechanism=self.principal.mechanism, sasl_plain_username=self.principal.username,
                           sasl_plain_password=self.principal.password.get_secret_value())
        return options
