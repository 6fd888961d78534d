"""The one settings object. The only reader of the environment (prefix ``TOKENFLEET_``) and of
the settings file.

Where a setting comes from, first match wins: an argument (the command line's options), the
environment (``TOKENFLEET_<NAME>``, nested with ``__``), a ``.env`` file, then the YAML settings
file named by ``TOKENFLEET_CONFIG`` (keys are the settings' names in lower case; an unknown key
is an error, not ignored: see ``examples/tokenfleet.yaml``), then the defaults below.

Empty ``kafka_bootstrap`` means: start the embedded Tansu broker on loopback (plaintext only).
A Kafka cluster that wants TLS or SASL gets them from the ``kafka_security_protocol``,
``kafka_sasl_*`` and ``kafka_ssl_*`` settings; ``infra.kafka.connection.KafkaConnection`` turns
them into every client's options. A combination that cannot work (credentials without SASL, a
certificate without its key, a file that is not there) is refused here, when the settings are
read. The SASL password is a ``SecretStr``: never printed, logged or echoed in an error (errors
do not repeat their input at all: the input holds the secrets). The ClickHouse
DSN defaults to the embedded engine (chdb) under ``data_dir``; point it at a server with
``TOKENFLEET_CLICKHOUSE_DSN=http://user:pass@host:8123/tokenfleet``.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from agents.policy.common.slo import DEFAULT_SLO_CLASSES, SloClass
from infra.files import read_yaml


class SloClassSetting(BaseSettings):
    ttft_s: float | None = None
    tpot_s: float | None = None
    deadline: bool = False
    client_timeout_s: float | None = None


def _default_slo_classes() -> dict[str, SloClassSetting]:
    return {
        name: SloClassSetting(
            ttft_s=c.ttft_s, tpot_s=c.tpot_s, deadline=c.deadline, client_timeout_s=c.client_timeout_s
        )
        for name, c in DEFAULT_SLO_CLASSES.items()
    }


CONFIG_ENV = "TOKENFLEET_CONFIG"
ENV_PREFIX = "TOKENFLEET_"


class ConfigError(ValueError):
    """The settings cannot be read. Its message is one line naming where (the settings file,
    with the line and column of a YAML syntax error, or the setting and where its value came
    from) and what is wrong; it never repeats a value (values hold secrets)."""


class _SettingsFile(YamlConfigSettingsSource):
    """The settings file named by ``TOKENFLEET_CONFIG``: a YAML mapping of setting names to
    values (an empty file is an empty mapping); anything else is a ``ConfigError``."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        return _settings_file(Path(file_path))


def _settings_file(path: Path) -> dict[str, Any]:
    try:
        data = read_yaml(path, "settings file")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"settings file {str(path)!r} must be a mapping of setting names to values (it is a "
            f"YAML {type(data).__name__}; see examples/tokenfleet.yaml)"
        )
    return data


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        hide_input_in_errors=True,  # an error would otherwise echo every setting, secrets included
    )

    config: Path | None = Field(
        default=None,
        description="a YAML settings file (keys: these settings' names in lower case); the "
        "environment overrides it. Only from the environment (TOKENFLEET_CONFIG)",
    )

    kafka_bootstrap: str = Field(default="", description="host:port[,host:port]; empty = embedded Tansu")
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT",
        description="how every Kafka client talks to the broker: SSL = TLS, SASL_SSL = TLS and a "
        "SASL login, SASL_PLAINTEXT = a SASL login in the clear (not with the embedded broker)",
    )
    kafka_sasl_mechanism: Literal["", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        default="", description="the SASL login's mechanism; required with a SASL_* protocol"
    )
    kafka_sasl_username: str = Field(default="", description="the SASL user; required with a SASL_* protocol")
    kafka_sasl_password: SecretStr = Field(
        default=SecretStr(""),
        description="the SASL user's password (a secret: from the environment or a mounted "
        "Kubernetes Secret, never printed); required with a SASL_* protocol",
    )
    kafka_ssl_cafile: Path | None = Field(
        default=None,
        description="PEM file of the CA(s) that signed the brokers' certificates; empty = the "
        "system's trusted CAs",
    )
    kafka_ssl_certfile: Path | None = Field(
        default=None, description="PEM client certificate for mutual TLS (with kafka_ssl_keyfile)"
    )
    kafka_ssl_keyfile: Path | None = Field(
        default=None, description="PEM private key of kafka_ssl_certfile (unencrypted)"
    )
    kafka_ssl_check_hostname: bool = Field(
        default=True,
        description="check that a broker's certificate names the host it was reached at; turn off "
        "only for brokers reached by an address their certificates do not name",
    )
    clickhouse_dsn: str = Field(
        default="", description="chdb:///path or http://host:8123/db; empty = embedded"
    )
    data_dir: Path = Field(
        default=Path(".tokenfleet"), description="local state: the embedded store, the spool, ready markers"
    )
    topic_partitions: int = Field(default=4, ge=1, description="partitions of each topic the worker creates")
    heartbeat_interval_s: float = Field(
        default=0.25, gt=0, description="how often the dispatcher publishes each instance's heartbeat"
    )
    policy: str = Field(default="round-robin", description="a policy name of agents/policy/registry.py")
    policy_params: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="stage name -> its parameters, e.g. {'tokenpilot': {...}}"
    )
    pools: list[str] = Field(
        default_factory=list,
        description="the model pools served; a request for another model is rejected at once. "
        "Empty = any model (one nobody serves is held until hold_timeout_s, then rejected)",
    )
    hold_max_per_pool: int = Field(default=10_000, ge=1, description="requests one queue pool may hold")
    watchdog_exit_on_disconnect: bool = Field(
        default=True,
        description="restart the worker at once when its broker connection breaks: right for one "
        "in-memory broker (the embedded Tansu loses its log); set false for a Kafka cluster",
    )
    hold_timeout_s: float = Field(default=60.0, gt=0, description="longest a request is held, seconds")
    decision_log_delay_s: float = Field(
        default=0.005,
        ge=0,
        description="how late a decider reads the other deciders' decisions on the log (the broker's "
        "round trip), seconds; with several deciders per pool, arrivals wait multiples of it",
    )
    dc_rtt_ms: dict[str, float] = Field(
        default_factory=dict, description="data centre -> round trip from the ingress, ms"
    )
    kv_link_gbps: dict[str, Annotated[float, Field(ge=0, allow_inf_nan=False)]] = Field(
        default_factory=dict,
        description="data centre -> gigabits per second of its link between prefill and decode "
        "instances, for moving a prompt's KV cache; a DC not named (or 0) has none: nothing there "
        "is served disaggregated",
    )
    fleet_rules: Path | None = Field(
        default=None,
        description="a fleet YAML (sim/engine/fleet.py's format) with FleetMind's rules: data "
        "centres, tenants, pinned versions, reservations; read when the policy has the fleetmind stage",
    )
    app_id: str = Field(
        default="tokenfleet",
        description="the Faust app id: its consumer group, its changelog topics",
    )
    refuse_other_schedulers: bool = Field(
        default=True,
        description="a worker refuses to start while another scheduler (another app id) decides the "
        "same requests: both would decide every request",
    )
    run_id: str = Field(
        default="",
        max_length=128,
        description="stamped on every row this worker stores (with its policy), so one run can be "
        "read apart from the others in a shared store; empty = app id and start time",
    )
    http_host: str = Field(
        default="127.0.0.1",
        description="the address the worker's and the dispatcher's /metrics, /health and /ready listen "
        "on; 0.0.0.0 for a Prometheus or a kubelet on another host",
    )
    worker_web_port: int = Field(
        default=6066, ge=0, le=65535, description="the worker's /metrics, /health, /ready; 0 = any free port"
    )
    dispatcher_web_port: int = Field(
        default=6067,
        ge=0,
        le=65535,
        description="the dispatcher's /metrics, /health, /ready; 0 = any free port",
    )
    direct_host: str = Field(
        default="127.0.0.1",
        description="the address the worker's direct lane listens on, where gateways ask it for "
        "decisions (streams/direct.py); 0.0.0.0 for gateways on other hosts",
    )
    direct_port: int = Field(
        default=0, ge=0, le=65535, description="the direct lane's port; 0 = any free port"
    )
    direct_advertised_host: str = Field(
        default="",
        max_length=253,
        description="the host gateways reach the direct lane at, as announced on tf.deciders (a pod's "
        "IP); empty = direct_host, or this machine's name when that is 0.0.0.0",
    )
    # Tansu holds a consumer-group join for half the rebalance timeout: keep these low there.
    broker_rebalance_timeout_s: float = Field(default=6.0, gt=0, description="group rebalance timeout")
    broker_session_timeout_s: float = Field(default=6.0, gt=0, description="consumer-group session timeout")
    broker_heartbeat_interval_s: float = Field(default=1.0, gt=0, description="group heartbeat interval")
    # How long a fetch may wait at the broker. Faust would wait 1.5 s on brokers that hold
    # fetches (Tansu does). Requests need it short (latency); the other topics (heartbeats, KV
    # events, completions) can wait longer, which saves the CPU of polling.
    request_fetch_max_wait_ms: int = Field(default=10, ge=1, description="longest a request fetch waits, ms")
    consumer_fetch_max_wait_ms: int = Field(
        default=100, ge=1, description="longest a fetch of the other topics waits, ms"
    )
    feedback_batch_size: int = Field(default=500, ge=1, description="rows per ClickHouse insert, at most")
    feedback_flush_s: float = Field(default=1.0, gt=0, description="a partial batch waits at most this long")
    # The feedback store off the request path (infra/clickhouse/feedback.py): fed from the topics
    # (infra/clickhouse/topic_sink.py), rows wait in a bounded memory buffer, and on local disk
    # (the spool) while ClickHouse is down or slow; an offset is committed once its row is durable.
    feedback_buffer_rows: int = Field(default=50_000, ge=1, description="rows in memory, at most")
    feedback_spool_dir: Path | None = Field(default=None, description="empty = <data_dir>/spool")
    feedback_spool_max_bytes: int = Field(
        default=512 * 1024 * 1024, ge=1, description="disk the spool may take, bytes; then the oldest rows go"
    )
    feedback_retry_s: float = Field(
        default=5.0, gt=0, description="retry budget of one ClickHouse write; then its rows spool"
    )
    feedback_commit_grace_s: float = Field(
        default=3.0,
        ge=0,
        description="the store's consumer (fed from the topics) waits this long for the store to "
        "acknowledge rows before a rebalance or a stop, to commit their offsets; what is not "
        "acknowledged by then is read again by the partition's next owner (stored once)",
    )
    feedback_close_s: float = Field(
        default=10.0, ge=0, description="at shutdown, time to flush to ClickHouse before spooling the rest"
    )
    # KV events and completions are taken in batches of up to ``event_batch_size`` or whatever
    # arrived within ``event_batch_window_s``. The window also sets how often an idle agent wakes
    # up (a short window costs an idle worker CPU: docs/results/speed.md); 50 ms delays a lone KV
    # event by at most that (the router credits blocks it has just routed meanwhile).
    event_batch_size: int = Field(default=512, ge=1, description="KV events or completions per batch")
    event_batch_window_s: float = Field(default=0.05, ge=0, description="a batch is taken after this long")
    request_batch_max: int = Field(default=256, ge=1, description="requests routed per lane batch, at most")
    slo_classes: dict[str, SloClassSetting] = Field(
        default_factory=_default_slo_classes,
        description="class -> its objectives (ttft_s, tpot_s, deadline, client_timeout_s), e.g. "
        "TOKENFLEET_SLO_CLASSES__INTERACTIVE__TTFT_S=1.5",
    )
    inventory: Path | None = Field(
        default=None,
        description="the real engines' inventory YAML (infra/vllm/inventory.py): the gateway "
        "and dispatcher reach its instances, the worker takes its models' tokenizers from it",
    )
    tokenizers: dict[str, Path] = Field(
        default_factory=dict,
        description="model pool -> a directory with its tokenizer.json, for requests that carry a "
        "prompt without input_tokens (the inventory's tokenizers are added to these)",
    )
    scrape_interval_s: float = Field(
        default=0.5, gt=0, description="how often each engine's /metrics is read"
    )
    api_keys: Path | None = Field(
        default=None,
        description="the gateway's API key file (YAML: keys: [{sha256, tenant, slo_classes, name}], "
        "gateway/auth.py): each caller's tenant and SLO classes come from its key; empty = no "
        "authentication, every call is tenant 'default'",
    )
    trust_tenant_header: bool = Field(
        default=False,
        description="the gateway sits behind a proxy that authenticates callers: take the tenant "
        "from its X-TokenFleet-Tenant header (not with api_keys)",
    )
    # What one client may hold of the gateway (gateway/connections.py says why these defaults).
    gateway_header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="the gateway closes a connection (408) whose request line and headers have "
        "not all arrived this long after the request's first byte (slowloris)",
    )
    gateway_idle_timeout_s: float = Field(
        default=75.0,
        gt=0,
        description="the gateway closes a connection with no call this long after it opened or "
        "its last call ended; keep it above a load balancer's idle timeout in front of it",
    )
    gateway_max_connections: int = Field(
        default=10_000,
        ge=1,
        description="client connections the gateway serves at once; one more is answered 503 "
        "(too_many_connections) and closed; lowered to what the open-file limit allows",
    )
    worker_run_token: str = Field(
        default="",
        description="names one run of a worker supervisor in its ready marker (set by whoever starts "
        "it and waits for it); empty = a fresh random token",
    )
    planner: str = Field(
        default="fleetmind",
        description="the planner `tokenfleet planner` runs (agents/policy/planners: static, hpa, "
        "dynamo-sla, fleetmind): the fleet's replicas per model version and DC, on tf.plans",
    )
    planner_interval_s: float | None = Field(
        default=None,
        gt=0,
        description="seconds between the planner's plans; empty = the planner's own interval "
        "(30 s for one that has none, such as static)",
    )
    planner_history_s: float = Field(
        default=600.0,
        gt=0,
        description="how far back a starting planner reads the topics (heartbeats, requests, "
        "admissions, completions, its own plans) to rebuild its state; keep it above "
        "planner_keepalive_intervals plans",
    )
    planner_keepalive_intervals: int = Field(
        default=10,
        ge=1,
        description="a pool's plan is published on tf.plans when it changes, and again after this "
        "many intervals without a change (so a reader that starts late learns it)",
    )
    planner_web_port: int = Field(
        default=6068, ge=0, le=65535, description="the planner's /metrics, /health, /ready; 0 = any free port"
    )
    vllm_python: Path | None = Field(
        default=None,
        description="the Python of a vLLM installation, for the CPU engines `tokenfleet up --engines "
        "local` starts (and the demo's, the tests'); empty = .venv-engine/bin/python of the checkout",
    )

    @model_validator(mode="after")
    def _kafka_security_is_usable(self) -> Settings:
        """The Kafka security settings make one working combination, or a one-line error."""
        problems = kafka_security_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then the environment, ``.env``, the settings file, secrets."""
        sources = [init_settings, env_settings, dotenv_settings]
        path = os.environ.get(CONFIG_ENV)
        if path:
            if not Path(path).is_file():
                raise ConfigError(f"{CONFIG_ENV}={path}: no such settings file")
            sources.append(_SettingsFile(settings_cls, yaml_file=path))
        return (*sources, file_secret_settings)

    def tokenizer_dirs(self) -> dict[str, Path]:
        """Model pool -> tokenizer directory: ``tokenizers`` over the inventory's."""
        found: dict[str, Path] = {}
        if self.inventory is not None:
            from infra.vllm.inventory import load_inventory

            found = load_inventory(self.inventory).tokenizer_dirs()
        return {**found, **self.tokenizers}

    @cached_property
    def clickhouse_url(self) -> str:
        return self.clickhouse_dsn or f"chdb:///{(self.data_dir / 'clickhouse').resolve()}"

    @cached_property
    def feedback_spool_path(self) -> Path:
        return self.feedback_spool_dir or self.data_dir / "spool"

    def slo(self) -> dict[str, SloClass]:
        """SLO classes as the policy core's plain objects."""
        return {
            name: SloClass(name, c.ttft_s, c.tpot_s, c.deadline, c.client_timeout_s)
            for name, c in self.slo_classes.items()
        }


def read_settings(**overrides: Any) -> Settings:
    """``Settings(**overrides)``, or a ``ConfigError`` whose one line names every refused
    setting with where its value came from (the argument, the environment variable, or the
    settings file) and why; a settings file that cannot be parsed is named with its line and
    column."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError("; ".join(_refusal(e, overrides) for e in exc.errors())) from None


def _refusal(error: Any, overrides: dict[str, Any]) -> str:
    """One refused value of a ``ValidationError``: ``where: why``."""
    loc = [str(part) for part in error["loc"]]
    why = "not a setting" if error["type"] == "extra_forbidden" else error["msg"]
    why = why.removeprefix("Value error, ")  # a validator's own message says it all
    if not loc:  # a check across settings (the Kafka security): its message names them
        return why
    name, dotted = loc[0], ".".join(loc)
    if name in overrides:
        return f"{dotted} (as given): {why}"
    variable = f"{ENV_PREFIX}{name}".upper()
    named = sorted(
        key for key in os.environ if key.upper() == variable or key.upper().startswith(variable + "__")
    )
    if named:
        return f"{named[0]}: {why}"
    path = os.environ.get(CONFIG_ENV)
    if path and name in _settings_file(Path(path)):
        return f"settings file {path!r}, setting {dotted}: {why}"
    return f"setting {dotted}: {why}"


def kafka_security_problems(settings: Settings) -> list[str]:
    """What is wrong with ``settings``' Kafka security, each as one line naming the variables to
    fix (empty: nothing). Settings that would be silently ignored count as wrong: a CA file with
    a plaintext protocol means the operator believes the link is encrypted when it is not."""
    protocol = settings.kafka_security_protocol
    tls, sasl = protocol in ("SSL", "SASL_SSL"), protocol.startswith("SASL_")
    env = "TOKENFLEET_KAFKA_"
    problems = []
    if protocol != "PLAINTEXT" and not settings.kafka_bootstrap:
        problems.append(
            f"{env}SECURITY_PROTOCOL={protocol} needs {env}BOOTSTRAP: the embedded broker speaks "
            "plaintext only"
        )
    given = settings.kafka_sasl_mechanism or settings.kafka_sasl_username
    if sasl:
        missing = [
            name
            for name, value in (
                ("SASL_MECHANISM", settings.kafka_sasl_mechanism),
                ("SASL_USERNAME", settings.kafka_sasl_username),
                ("SASL_PASSWORD", settings.kafka_sasl_password.get_secret_value()),
            )
            if not value
        ]
        if missing:
            problems.append(f"{env}SECURITY_PROTOCOL={protocol} needs " + ", ".join(env + m for m in missing))
    elif given or settings.kafka_sasl_password.get_secret_value():
        problems.append(
            f"SASL credentials ({env}SASL_*) need {env}SECURITY_PROTOCOL=SASL_SSL or SASL_PLAINTEXT "
            f"(it is {protocol})"
        )
    files = {
        "SSL_CAFILE": settings.kafka_ssl_cafile,
        "SSL_CERTFILE": settings.kafka_ssl_certfile,
        "SSL_KEYFILE": settings.kafka_ssl_keyfile,
    }
    if not tls and any(files.values()):
        problems.append(
            f"TLS files ({env}SSL_*) need {env}SECURITY_PROTOCOL=SSL or SASL_SSL (it is {protocol})"
        )
    if bool(settings.kafka_ssl_certfile) != bool(settings.kafka_ssl_keyfile):
        problems.append(
            f"{env}SSL_CERTFILE and {env}SSL_KEYFILE go together (mutual TLS): set both or neither"
        )
    for name, path in files.items():
        if path is not None and not path.is_file():
            problems.append(f"{env}{name}={path}: no such file")
    return problems
