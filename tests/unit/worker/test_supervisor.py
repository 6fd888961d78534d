"""A worker whose broker does not answer says so in one line, then waits quietly; SIGTERM still
stops it at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from infra.kafka.broker import free_port

ROOT = Path(__file__).resolve().parents[3]


def test_an_unreachable_broker_is_one_line_then_quiet_probes(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    env = {**os.environ, "TOKENFLEET_KAFKA_BOOTSTRAP": address, "TOKENFLEET_DATA_DIR": str(tmp_path)}
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "worker"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(8.0)  # several probes: 0.25-0.5 s apart at first, doubling
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert f"Kafka broker {address} unreachable" in lines[0]
    assert "retrying every 0.5 s, backing off to every 30 s" in lines[0]
    assert out == "" and process.returncode == 0
