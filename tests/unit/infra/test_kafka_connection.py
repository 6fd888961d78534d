"""The Kafka security settings and the one connection object every client is built from."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import faust
import pytest
from pydantic import SecretStr

from cli.main import main
from infra.kafka.connection import KafkaConnection
from infra.settings import Settings
from worker.child import ChildSpec
from worker.watchdog import WatchdogLimits

PASSWORD = "pa55-not-for-logs"


def sasl(**more: Any) -> dict[str, Any]:
    return {
        "kafka_bootstrap": "kafka-1:9093,kafka-2:9093",
        "kafka_security_protocol": "SASL_SSL",
        "kafka_sasl_mechanism": "SCRAM-SHA-512",
        "kafka_sasl_username": "tokenfleet",
        "kafka_sasl_password": PASSWORD,
        **more,
    }


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    """A CA file ``ssl`` can load: the ones the system trusts (any PEM bundle does)."""
    bundle = ssl.get_default_verify_paths().cafile or ssl.get_default_verify_paths().openssl_cafile
    path = tmp_path / "ca.pem"
    path.write_bytes(Path(bundle).read_bytes())
    return path


def test_plaintext_by_default() -> None:
    connection = KafkaConnection.from_settings(Settings(kafka_bootstrap="k:9092"))
    assert connection.client_options() == {"bootstrap_servers": "k:9092", "security_protocol": "PLAINTEXT"}
    assert connection.faust_credentials() is None
    assert connection.faust_broker() == "kafka://k:9092"


def test_sasl_ssl_gives_every_client_the_login_and_the_tls_context(pem: Path) -> None:
    connection = KafkaConnection.from_settings(Settings(**sasl(kafka_ssl_cafile=pem)))
    options = connection.client_options()
    assert options["bootstrap_servers"] == "kafka-1:9093,kafka-2:9093"
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("tokenfleet", PASSWORD)
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext) and context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED
    credentials = connection.faust_credentials()
    assert isinstance(credentials, faust.SASLCredentials)
    assert credentials.protocol.value == "SASL_SSL" and credentials.mechanism.value == "SCRAM-SHA-512"
    assert credentials.ssl_context is context and credentials.password == PASSWORD
    assert connection.faust_broker() == "kafka://kafka-1:9093;kafka://kafka-2:9093"
    # What logs and messages show of it: never the password.
    assert PASSWORD not in repr(connection) + str(connection) + repr(credentials)


def test_ssl_with_hostname_check_off(pem: Path) -> None:
    settings = Settings(
        kafka_bootstrap="k:9093",
        kafka_security_protocol="SSL",
        kafka_ssl_cafile=pem,
        kafka_ssl_check_hostname=False,
    )
    connection = KafkaConnection.from_settings(settings)
    assert connection.ssl_context is not None and not connection.ssl_context.check_hostname
    assert isinstance(connection.faust_credentials(), faust.SSLCredentials)
    assert "sasl_mechanism" not in connection.client_options()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"kafka_security_protocol": "SSL"}, "needs TOKENFLEET_KAFKA_BOOTSTRAP: the embedded broker"),
        (sasl(kafka_sasl_password=""), "SASL_SSL needs TOKENFLEET_KAFKA_SASL_PASSWORD"),
        (
            sasl(kafka_sasl_mechanism="", kafka_sasl_username=""),
            "needs TOKENFLEET_KAFKA_SASL_MECHANISM, TOKENFLEET_KAFKA_SASL_USERNAME",
        ),
        (sasl(kafka_security_protocol="SSL"), "SASL credentials (TOKENFLEET_KAFKA_SASL_*) need"),
        (
            sasl(kafka_ssl_certfile="/etc/hostname"),
            "SSL_CERTFILE and TOKENFLEET_KAFKA_SSL_KEYFILE go together",
        ),
        (
            sasl(kafka_ssl_cafile="/no/such/ca.pem"),
            "TOKENFLEET_KAFKA_SSL_CAFILE=/no/such/ca.pem: no such file",
        ),
        (
            {"kafka_bootstrap": "k:1", "kafka_ssl_cafile": "/etc/hostname"},
            "TLS files (TOKENFLEET_KAFKA_SSL_*) need TOKENFLEET_KAFKA_SECURITY_PROTOCOL=SSL",
        ),
    ],
)
def test_a_combination_that_cannot_work_is_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        Settings(**settings)
    assert message in str(raised.value)
    assert PASSWORD not in str(raised.value)


def test_an_unreadable_tls_file_is_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate")
    settings = Settings(kafka_bootstrap="k:9093", kafka_security_protocol="SSL", kafka_ssl_cafile=junk)
    with pytest.raises(ValueError, match=r"the Kafka TLS files .*ca.pem.* cannot be used"):
        KafkaConnection.from_settings(settings)


def test_the_cli_names_a_bad_combination_in_one_line_without_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in sasl(kafka_sasl_username="").items():
        monkeypatch.setenv(f"TOKENFLEET_{name.upper()}", value)
    assert main(["batch", "results", "job-1", "--out", "/dev/null"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "TOKENFLEET_KAFKA_SASL_USERNAME" in err
    assert PASSWORD not in err


def test_the_worker_child_gets_the_password_itself() -> None:
    """``model_dump`` masks a secret; the child's settings (on its stdin) must carry it."""
    settings = Settings(**sasl())
    spec = ChildSpec(settings, {"supervisor": 1}, WatchdogLimits(), "warn")
    again = ChildSpec.loads(spec.dumps())
    assert again.settings.kafka_sasl_password.get_secret_value() == PASSWORD
    assert json.loads(spec.dumps())["settings"]["kafka_sasl_password"] == PASSWORD
    assert PASSWORD not in repr(settings) and isinstance(settings.kafka_sasl_password, SecretStr)
