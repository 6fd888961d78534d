"""A worker started before its broker: one line says the broker is unreachable, the supervisor
probes quietly, one more line says when it answers, and the worker then starts. This test owns
its broker (not the session's): it starts it late, on the port the worker was given."""

from __future__ import annotations

import time
from pathlib import Path

from infra.kafka.broker import embedded_broker, free_port
from tests.integration.streaming import unique, worker


def test_a_worker_started_before_its_broker_says_so_once_and_starts_once_it_answers(tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    early = worker(address, unique("early"), tmp_path / "worker")

    def lines() -> list[str]:
        return early.log_path.read_text(errors="replace").splitlines()

    try:
        time.sleep(3.0)  # several quiet probes
        assert len(lines()) == 1 and f"Kafka broker {address} unreachable (" in lines()[0], lines()
        with embedded_broker(log_path=tmp_path / "tansu.log", port=port):
            deadline = time.monotonic() + 15
            while not any("(start 1)" in line for line in lines()) and time.monotonic() < deadline:
                time.sleep(0.1)  # the broker answers, topics are created, the worker starts
            said = lines()
            assert sum("unreachable (" in line for line in said) == 1, said
            assert sum(f"Kafka broker {address} answers again" in line for line in said) == 1, said
            assert any("(start 1)" in line for line in said), said
            assert early.stop() == 0
    finally:
        if early.process.poll() is None:
            early.stop(kill=True)
