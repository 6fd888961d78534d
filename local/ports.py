"""The local ports a ``tokenfleet up`` stack takes: the ones the settings name where they are free,
else any free one; the gateway's fails loudly instead (the user asked for it)."""

from __future__ import annotations

import socket

from infra.kafka.broker import free_port


def client_host(host: str) -> str:
    """The address a client on this machine uses for a server listening on ``host``."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind ``port`` on ``host`` now."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is free
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_or_free(port: int) -> int:
    """``port`` if it is free here, else any free port (another stack, or a worker, may hold it)."""
    return port if port and port_free("127.0.0.1", port) else free_port()


def gateway_port_for(host: str, port: int) -> int:
    """``port`` for the gateway on ``host`` (0: any free port); ``ValueError`` if it is taken."""
    if port == 0:
        return free_port()
    if not port_free(host, port):
        raise ValueError(f"port {port} is in use on {host}: pass --port N (0: any free port)")
    return port
