"""How every Kafka client of the project reaches the broker: its addresses and its security.

``KafkaConnection`` is the one value a client is built from: the worker's readers and Faust
app, the dispatcher, the gateway, the admin client that creates topics, the readiness probes and
the command line's publishers all take it instead of a bare bootstrap string, so none of them
can be built without the TLS and SASL settings. It is made once per process from the settings
(``infra.kafka.bus.kafka_connection``: the configured Kafka, or the embedded Tansu broker, which
speaks plaintext only) and handed down.

What it produces:

- ``client_options()``: the keyword arguments of ``AIOKafkaProducer``, ``AIOKafkaConsumer`` and
  ``AIOKafkaAdminClient`` (``bootstrap_servers``, ``security_protocol``, ``ssl_context``,
  ``sasl_mechanism``, ``sasl_plain_username``, ``sasl_plain_password``);
- ``security_options()``: the same without the addresses (``aiokafka.conn.create_conn``);
- ``faust_broker()`` and ``faust_credentials()``: the Faust app's ``broker`` URL and its
  ``broker_credentials`` (``faust.SSLCredentials`` or ``faust.SASLCredentials``).

The TLS context is built once, when the connection is made (``from_settings``), so a CA, a
certificate or a key that cannot be read is one line at start rather than a failure at the
first connection. The password stays a ``SecretStr`` until the moment a client needs it and is
never part of ``repr`` or ``str`` (which show the addresses and the protocol).
"""

from __future__ import annotations

import dataclasses
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

if TYPE_CHECKING:
    from infra.settings import Settings

PLAINTEXT = "PLAINTEXT"


@dataclass(frozen=True)
class KafkaConnection:
    """The broker's addresses (``host:port[,host:port]``) and how to talk to them.

    Build it with ``from_settings`` (or ``plaintext`` for a broker the process started itself);
    the combination is checked there and by ``Settings``. Immutable; ``with_bootstrap`` gives
    the same security towards other addresses."""

    bootstrap: str
    security_protocol: str = PLAINTEXT
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: SecretStr = field(default=SecretStr(""), repr=False)
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_check_hostname: bool = True
    # Built once from the files above (see the module docstring); None without TLS.
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    @classmethod
    def plaintext(cls, bootstrap: str) -> KafkaConnection:
        """A broker without TLS or SASL: the embedded Tansu, a lab's broker."""
        return cls(bootstrap)

    @classmethod
    def from_settings(cls, settings: Settings, bootstrap: str | None = None) -> KafkaConnection:
        """The connection ``settings`` describe, to ``bootstrap`` (default: the configured
        ``kafka_bootstrap``). ``ValueError`` (one line) when a TLS file cannot be used."""
        connection = cls(
            bootstrap if bootstrap is not None else settings.kafka_bootstrap,
            security_protocol=settings.kafka_security_protocol,
            sasl_mechanism=settings.kafka_sasl_mechanism,
            sasl_username=settings.kafka_sasl_username,
            sasl_password=settings.kafka_sasl_password,
            ssl_cafile=settings.kafka_ssl_cafile,
            ssl_certfile=settings.kafka_ssl_certfile,
            ssl_keyfile=settings.kafka_ssl_keyfile,
            ssl_check_hostname=settings.kafka_ssl_check_hostname,
        )
        return connection.with_ssl_context()

    def with_ssl_context(self) -> KafkaConnection:
        """This connection with its TLS context built from the files (itself without TLS)."""
        if not self.uses_tls or self.ssl_context is not None:
            return self
        from aiokafka.helpers import create_ssl_context

        try:
            context = create_ssl_context(
                cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile
            )
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            files = ", ".join(str(p) for p in (self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile) if p)
            raise ValueError(f"the Kafka TLS files ({files or 'system CAs'}) cannot be used: {exc}") from None
        context.check_hostname = self.ssl_check_hostname
        return dataclasses.replace(self, ssl_context=context)

    def with_bootstrap(self, bootstrap: str) -> KafkaConnection:
        """The same security towards ``bootstrap``."""
        return dataclasses.replace(self, bootstrap=bootstrap)

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def addresses(self) -> list[str]:
        """The bootstrap addresses, ``host:port`` each."""
        return [a.strip() for a in self.bootstrap.split(",") if a.strip()]

    def security_options(self) -> dict[str, Any]:
        """The security keyword arguments every aiokafka client and ``create_conn`` take."""
        options: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.uses_tls:
            options["ssl_context"] = self.with_ssl_context().ssl_context
        if self.uses_sasl:
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.sasl_username
            options["sasl_plain_password"] = self.sasl_password.get_secret_value()
        return options

    def client_options(self) -> dict[str, Any]:
        """``bootstrap_servers`` and the security options: spread them into ``AIOKafkaProducer``,
        ``AIOKafkaConsumer`` or ``AIOKafkaAdminClient``."""
        return {"bootstrap_servers": self.bootstrap, **self.security_options()}

    def faust_broker(self) -> str:
        """The Faust app's ``broker`` setting: one ``kafka://`` URL per address."""
        return ";".join(f"kafka://{address}" for address in self.addresses)

    def faust_credentials(self) -> Any:
        """The Faust app's ``broker_credentials``: ``SASLCredentials`` (with the TLS context for
        SASL_SSL), ``SSLCredentials`` for SSL, ``None`` for plaintext."""
        import faust

        context = self.with_ssl_context().ssl_context
        if self.uses_sasl:
            return faust.SASLCredentials(
                username=self.sasl_username,
                password=self.sasl_password.get_secret_value(),
                ssl_context=context,
                mechanism=self.sasl_mechanism,
            )
        if self.uses_tls:
            return faust.SSLCredentials(context)
        return None

    def __str__(self) -> str:
        """For logs and messages: the addresses, and the protocol when it is not plaintext."""
        if self.security_protocol == PLAINTEXT:
            return self.bootstrap
        return f"{self.bootstrap} ({self.security_protocol})"
