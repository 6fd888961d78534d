"""Start and stop real vLLM servers (CPU) on this machine, for the integration tests and the demo.

vLLM lives in its own environment (``make engine`` builds ``.venv-engine``): its torch and
transformers pins do not mix with the control plane's packages, so the servers are child
processes of that environment's python. Each server is one OpenAI-compatible HTTP server on
127.0.0.1 (``/health``, ``/v1/*``, ``/metrics``) with prefix caching on and its KV events
published over ZMQ (a PUB socket with a ROUTER replay socket), serving one model directory with
random weights (``--load-format dummy``, e.g. ``local.tiny_model``; ``load_format`` says
otherwise, for a directory with weights of its own).

Prefill/decode disaggregation: with a ``kv_connector`` (vLLM's ``--kv-transfer-config`` without
its ``kv_role``) every server gets that connector in the role its spec's ``role`` asks
(``VllmServerSpec.kv_role``), and the inventory says each server's role, so its heartbeats do.

Start-up time is Python imports, not the model: ``--enforce-eager`` (no torch.compile), an
explicit KV size (``--num-gpu-blocks-override``, so no memory profiling) and, by default, the
model worker inside the engine-core process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: one spawned
interpreter fewer per server: its start-up time and memory saved). vLLM's own worker process is what
pins the OpenMP threads to ``VLLM_CPU_OMP_THREADS_BIND``; without it the same pinning is asked
of the OpenMP runtime directly (``OMP_PLACES``/``OMP_PROC_BIND``, one thread per server).

Every server runs in a session (process group) of its own, so stopping or killing one reaches
the engine-core process it spawned as well.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from infra.settings import Settings
from infra.vllm.inventory import InstanceEntry, Inventory, ModelEntry
from schemas.events import ROLES, Role

ENGINE_PYTHON_ENV = "TOKENFLEET_VLLM_PYTHON"  # Settings.vllm_python, named in messages
ENGINE_MISSING = (
    "no vLLM engine environment: run `make engine` (installs vLLM for CPU into .venv-engine) or set "
    f"{ENGINE_PYTHON_ENV} to the python of an environment that has vllm-cpu"
)
HOST = "127.0.0.1"
STOP_GRACE_S = 10.0
MAX_NUM_SEQS = 32  # calls a server runs at once (vLLM's --max-num-seqs), the rest wait
# Tokens one step computes (--max-num-batched-tokens): vLLM's own default for an API server on
# CPU, given explicitly so that the inventory, and the heartbeats, can say it.
MAX_NUM_BATCHED_TOKENS = 2048
LOG_TAIL_LINES = 20
# Values of the caller's environment that would mix its packages into the engine's interpreter.
_DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")
# vLLM's KV-connector role of a server of each TokenFleet role.
_KV_ROLES: dict[Role, str] = {"prefill": "kv_producer", "decode": "kv_consumer", "both": "kv_both"}
DTYPE_BYTES = 4  # the servers compute in float32 (``--dtype`` in ``VllmServers.command``)


class VllmStartError(RuntimeError):
    """A server could not be started: no engine environment, an exit or a health timeout (the
    message carries the end of that server's log). The other servers are stopped already."""


@dataclass(frozen=True)
class VllmServerSpec:
    """One server: its id in the inventory, its HTTP and ZMQ ports on 127.0.0.1, the CPU core
    its model threads are pinned to (instances on different cores do not compete) and its
    ``role`` in prefill/decode disaggregation (``prefill``, ``decode`` or ``both``)."""

    instance_id: str
    port: int
    kv_events_port: int
    kv_replay_port: int
    core: int
    dc: str = "local"
    role: Role = "both"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role {self.role!r} is not one of {', '.join(ROLES)}")

    @property
    def kv_role(self) -> str:
        """vLLM's ``kv_role`` of this server's KV connector: ``kv_producer`` (prefill),
        ``kv_consumer`` (decode) or ``kv_both``."""
        return _KV_ROLES[self.role]

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def kv_events(self) -> str:
        return f"tcp://{HOST}:{self.kv_events_port}"

    @property
    def kv_replay(self) -> str:
        return f"tcp://{HOST}:{self.kv_replay_port}"


def engine_python_or_none() -> str | None:
    """The engine environment's python, or None when there is none.

    ``$TOKENFLEET_VLLM_PYTHON`` when set (None if that file does not exist); otherwise
    ``.venv-engine/bin/python`` of the checkout this module is in, then of the current directory
    (the package installed elsewhere, run from a checkout). For error messages, never for
    deciding to skip a test.
    """
    configured = Settings().vllm_python
    if configured is not None:
        return str(configured) if configured.is_file() else None
    relative = Path(".venv-engine") / "bin" / "python"
    for root in (Path(__file__).resolve().parents[1], Path.cwd()):
        if (root / relative).is_file():
            return str(root / relative)
    return None


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on every interface right now, drawn at random below the
    kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``), which ``bind(0)``
    and outgoing connections take ports from: a port chosen here stays free until a server binds
    it, however long that server waits to start (a stack's standby slot), unless another program
    asks for that very port. Where there is no room below the range: ports ``bind(0)`` gives."""
    low = _ephemeral_low()
    below = range(max(1024, low - 16384), low)
    chosen: list[int] = []
    if len(below) >= 4 * n:
        for port in random.sample(below, len(below)):
            if _bindable(port):
                chosen.append(port)
                if len(chosen) == n:
                    return chosen
    sockets: list[socket.socket] = []
    try:
        for _ in range(n - len(chosen)):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("", 0))  # all held at once, so the ports differ
            sockets.append(sock)
        return chosen + [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def kv_bytes_per_token(model_dir: Path) -> int:
    """The KV cache one prompt token takes on a server of ``model_dir``: keys and values of
    every layer, ``2 * layers * kv_heads * head_dim * DTYPE_BYTES`` (``head_dim`` defaults to
    ``hidden_size / num_attention_heads``), from its ``config.json``; 0 when that cannot be read."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * DTYPE_BYTES
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def server_specs(n: int, prefix: str = "vllm", dc: str = "local") -> list[VllmServerSpec]:
    """``n`` specs ``<prefix>-0`` .. on free ports, server i pinned to core ``i % cores``."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    ports = free_ports(3 * n)
    return [
        VllmServerSpec(
            f"{prefix}-{i}", ports[3 * i], ports[3 * i + 1], ports[3 * i + 2], cores[i % len(cores)], dc
        )
        for i in range(n)
    ]


class VllmServers:
    """vLLM servers over one model directory, started together and stopped together.

    ``start`` launches every server at once and returns when each answers ``GET /health`` with
    200; a server that exits or is not healthy within ``startup_timeout_s`` stops all of them and
    raises ``VllmStartError``. ``stop`` is idempotent and also runs at interpreter exit, so no
    server outlives its owner unless that owner is killed with SIGKILL. Use as a context manager
    or call ``start``/``stop``. Not thread-safe: one owner drives it.

    Each server's output goes to ``<data_dir>/<instance_id>.log``; its caches and temporary files
    (vLLM, torch inductor, TMPDIR) stay under ``<data_dir>/<instance_id>/``.
    """

    def __init__(
        self,
        specs: Sequence[VllmServerSpec],
        model_dir: Path,
        data_dir: Path,
        *,
        served_model_name: str = "tiny-llama",
        model_version: str = "v1",
        python: str | None = None,
        startup_timeout_s: float = 180.0,
        block_size: int = 32,
        num_blocks: int = 256,
        max_model_len: int = 4096,
        max_num_seqs: int = MAX_NUM_SEQS,
        worker_in_engine_process: bool = True,
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        nice: int = 0,
        load_format: str = "dummy",
        kv_connector: Mapping[str, Any] | None = None,
    ) -> None:
        """``num_blocks`` KV blocks of ``block_size`` tokens per server (a multiple of 32 on
        CPU): small, so prefix-cache eviction happens under test load. ``python`` defaults to
        ``engine_python_or_none()``. ``worker_in_engine_process=False`` keeps vLLM's default
        process layout (a separate worker process; slower to start, more memory). ``nice``: the
        servers' CPU niceness (0-19; every thread of theirs inherits it): on a machine where the
        engines compute on the same cores as the services beside them, the services then run
        first, as they would beside engines on accelerators. ``load_format``: vLLM's
        ``--load-format`` (``dummy``: random weights; ``safetensors``: the directory's own).
        ``kv_connector``: vLLM's ``--kv-transfer-config`` without ``kv_role`` (e.g.
        ``{"kv_connector": "ExampleConnector", "kv_connector_extra_config": {...}}``), given to
        every server in its spec's ``kv_role``; None: no connector (no server can then take part
        in a disaggregated call)."""
        ids = [s.instance_id for s in specs]
        ports = [p for s in specs for p in (s.port, s.kv_events_port, s.kv_replay_port)]
        if not specs or len(set(ids)) != len(ids) or len(set(ports)) != len(ports):
            raise ValueError(f"specs need distinct instance ids and ports: {list(specs)}")
        self.specs: tuple[VllmServerSpec, ...] = tuple(specs)
        self.model_dir = Path(model_dir).resolve()
        self.data_dir = Path(data_dir).resolve()
        self.served_model_name = served_model_name
        self.model_version = model_version
        self.python = python
        self.startup_timeout_s = startup_timeout_s
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.worker_in_engine_process = worker_in_engine_process
        self.extra_args = tuple(extra_args)
        self.extra_env = dict(extra_env or {})
        if not 0 <= nice <= 19:
            raise ValueError(f"nice must be in 0..19, got {nice}")
        self.nice = nice
        self.load_format = load_format
        if kv_connector is not None and "kv_role" in kv_connector:
            raise ValueError("kv_connector must not name a kv_role: each server's spec gives it")
        self.kv_connector = None if kv_connector is None else dict(kv_connector)
        self.startup_s: dict[str, float] = {}  # seconds from (re)launch to the first healthy answer
        self._python: str | None = None
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> VllmServers:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Launch every server concurrently and wait until all are healthy. Raises
        ``VllmStartError`` (every server stopped) on failure; on any other exception,
        KeyboardInterrupt included, the servers are stopped before it propagates."""
        if self._processes:
            raise RuntimeError("VllmServers.start called twice")
        python = self.python or engine_python_or_none()
        if python is None or not Path(python).is_file():
            raise VllmStartError(
                ENGINE_MISSING if python is None else f"{python} does not exist. {ENGINE_MISSING}"
            )
        if not (self.model_dir / "config.json").is_file():
            raise VllmStartError(f"{self.model_dir} is not a model directory (no config.json)")
        self._python = python
        atexit.register(self.stop)
        try:
            launched = {spec.instance_id: self._launch(python, spec) for spec in self.specs}
            self._wait_healthy(launched)
        except BaseException:
            self.stop()
            raise

    def restart(self, instance_id: str) -> None:
        """Start one server again (killed first if it still runs), same ports and log, and wait
        until it is healthy: a crashed instance coming back. Raises ``VllmStartError`` (that
        server killed, the others untouched) on failure."""
        self._relaunch([self.spec(instance_id).instance_id])

    def revive(self) -> list[str]:
        """Restart, together, every server whose process has exited (killed or crashed), wait
        until they are healthy and return their ids (none: nothing done). Failure as ``restart``."""
        dead = [i for i, process in self._processes.items() if process.poll() is not None]
        if dead:
            self._relaunch(dead)
        return dead

    def stop(self) -> None:
        """SIGTERM every server's process group, wait up to 10 s for them all, SIGKILL what is
        left. Idempotent; never raises for processes that are gone already."""
        atexit.unregister(self.stop)
        processes = list(self._processes.values())
        for process in processes:
            _signal_server(process, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while any(_group_alive(p.pid) for p in processes) and time.monotonic() < deadline:
            for process in processes:
                process.poll()  # reap the API servers as they exit
            time.sleep(0.1)
        for process in processes:
            _signal_server(process, signal.SIGKILL)
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        for log in self._logs.values():
            log.close()
        self._processes.clear()
        self._logs.clear()

    def kill(self, instance_id: str) -> None:
        """SIGKILL one server's process group now (a crash, as tests inject it); no-op if it is
        not running. The others keep running; ``stop`` still covers it."""
        process = self._processes.get(self.spec(instance_id).instance_id)
        if process is None:
            return
        _signal_server(process, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        # The engine-core process it spawned dies with it, but not in the same instant (a large
        # process takes a moment to tear down): return once the whole group is gone.
        deadline = time.monotonic() + 5
        while _group_alive(process.pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    # -- what the servers are --------------------------------------------------------------------

    def spec(self, instance_id: str) -> VllmServerSpec:
        found = next((s for s in self.specs if s.instance_id == instance_id), None)
        if found is None:
            raise KeyError(f"no server {instance_id!r} (known: {[s.instance_id for s in self.specs]})")
        return found

    def url(self, instance_id: str) -> str:
        """``http://127.0.0.1:<port>`` of that server (no trailing slash)."""
        return self.spec(instance_id).url

    def log_path(self, instance_id: str) -> Path:
        return self.data_dir / f"{self.spec(instance_id).instance_id}.log"

    def is_running(self, instance_id: str) -> bool:
        """Its main process was started and has not exited (says nothing about health)."""
        process = self._processes.get(self.spec(instance_id).instance_id)
        return process is not None and process.poll() is None

    def pid(self, instance_id: str) -> int | None:
        """The API server's pid (also its process group and session id) while started."""
        process = self._processes.get(self.spec(instance_id).instance_id)
        return None if process is None else process.pid

    def inventory(self) -> Inventory:
        """The inventory of these servers (every spec, a killed one included: an inventory lists
        the fleet, not who is up), with the model directory as the model's tokenizer, each
        server's role, the model's ``kv_bytes_per_token`` and the servers' scheduler limits."""
        name = self.served_model_name
        kv_bytes = kv_bytes_per_token(self.model_dir)
        instances = tuple(
            InstanceEntry(
                instance_id=spec.instance_id,
                url=spec.url,
                model=name,
                version=self.model_version,
                dc=spec.dc,
                served_model_name=name,
                kv_events=spec.kv_events,
                kv_replay=spec.kv_replay,
                role=spec.role,
                kv_bytes_per_token=kv_bytes,
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            )
            for spec in self.specs
        )
        return Inventory({name: ModelEntry(name, self.model_version, self.model_dir)}, instances)

    # -- internals -------------------------------------------------------------------------------

    def command(self, python: str, spec: VllmServerSpec) -> list[str]:
        """The command line of one server."""
        kv_events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            # A PUB endpoint with a host makes vLLM *connect* to a subscriber; only a wildcard
            # binds (every interface). The replay ROUTER always binds, so it can stay local.
            "endpoint": f"tcp://*:{spec.kv_events_port}",
            "replay_endpoint": f"tcp://{HOST}:{spec.kv_replay_port}",
            "topic": "kv",
        }
        # `vllm serve` cannot be used: its entry point looks up the distribution "vllm", and the
        # CPU build is published as "vllm-cpu".
        return [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_model_name,
            "--load-format",
            self.load_format,
            # "auto" would downcast the config's float32 to bfloat16, which this CPU class (AVX2,
            # no AVX512-BF16) emulates: slower, and oneDNN gives up on its matmuls.
            "--dtype",
            "float32",
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens
            "--enforce-eager",
            "--block-size",
            str(self.block_size),
            "--num-gpu-blocks-override",
            str(self.num_blocks),
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-num-batched-tokens",
            str(MAX_NUM_BATCHED_TOKENS),
            "--kv-events-config",
            json.dumps(kv_events),
            "--disable-uvicorn-access-log",  # health and metrics polls would fill the log
            "--host",
            HOST,
            "--port",
            str(spec.port),
            *self._kv_transfer_args(spec),
            *self.extra_args,
        ]

    def _kv_transfer_args(self, spec: VllmServerSpec) -> list[str]:
        if self.kv_connector is None:
            return []
        return ["--kv-transfer-config", json.dumps({**self.kv_connector, "kv_role": spec.kv_role})]

    def environment(self, spec: VllmServerSpec) -> dict[str, str]:
        """The environment of one server: the caller's, minus its Python path, plus the engine's."""
        private = self.data_dir / spec.instance_id
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        env.update(
            {
                "HF_HUB_OFFLINE": "1",  # a local directory; never ask the Hub
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",  # no usage report sent home
                "DO_NOT_TRACK": "1",
                # GiB reserved for KV; the block count above is what the cache really holds.
                "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_CPU_OMP_THREADS_BIND": str(spec.core),  # unset, every server binds core 0
                "VLLM_CACHE_ROOT": str(private / "vllm-cache"),
                "TORCHINDUCTOR_CACHE_DIR": str(private / "inductor-cache"),
                "TMPDIR": str(private / "tmp"),
                "PYTHONUNBUFFERED": "1",  # the log tail in an error shows the latest lines
            }
        )
        if self.worker_in_engine_process:
            env.update(
                {
                    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                    "OMP_NUM_THREADS": "1",
                    "OMP_PLACES": f"{{{spec.core}}}",
                    "OMP_PROC_BIND": "true",
                }
            )
        env.update(self.extra_env)
        return env

    def _relaunch(self, instance_ids: list[str]) -> None:
        python = self._python
        if python is None or any(i not in self._processes for i in instance_ids):
            raise RuntimeError("VllmServers can restart started servers only (not stopped ones)")
        for instance_id in instance_ids:
            self.kill(instance_id)
            self._logs.pop(instance_id).close()
        try:
            self._wait_healthy({i: self._launch(python, self.spec(i)) for i in instance_ids})
        except BaseException:
            for instance_id in instance_ids:
                self.kill(instance_id)
            raise

    def prepare(self, spec: VllmServerSpec) -> Path:
        """The server's own directory (its working directory) with the caches and temporary
        directory ``environment`` points it at, created."""
        private = self.data_dir / spec.instance_id
        for sub in ("vllm-cache", "inductor-cache", "tmp"):
            (private / sub).mkdir(parents=True, exist_ok=True)
        return private

    def _launch(self, python: str, spec: VllmServerSpec) -> float:
        private = self.prepare(spec)
        log = self.log_path(spec.instance_id).open("ab")
        self._logs[spec.instance_id] = log
        self._processes[spec.instance_id] = subprocess.Popen(
            self.command(python, spec),
            env=self.environment(spec),
            cwd=private,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: signals reach its engine core too
            # (set before exec, so every thread and process the server starts inherits it)
            preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None,
        )
        return time.monotonic()

    def _wait_healthy(self, launched: dict[str, float]) -> None:
        deadline = min(launched.values()) + self.startup_timeout_s
        waiting = dict(launched)
        while waiting:
            for instance_id, started in list(waiting.items()):
                process = self._processes[instance_id]
                if _healthy(self.spec(instance_id).url):
                    self.startup_s[instance_id] = time.monotonic() - started
                    del waiting[instance_id]
                elif process.poll() is not None:
                    raise VllmStartError(self._failure(instance_id, f"exited with code {process.returncode}"))
            if waiting and time.monotonic() > deadline:
                first = sorted(waiting)[0]
                raise VllmStartError(
                    self._failure(first, f"did not answer /health within {self.startup_timeout_s:.0f} s")
                )
            if waiting:
                time.sleep(0.25)

    def _failure(self, instance_id: str, what: str) -> str:
        log = self.log_path(instance_id)
        self._logs[instance_id].flush()
        try:
            lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        except OSError:
            lines = []
        return f"vLLM server {instance_id} {what}; last lines of {log}:\n" + "\n".join(lines)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _signal_server(process: subprocess.Popen[bytes], signum: int) -> None:
    """Signal the process group a server leads. Its id is the leader's pid, so it is only used
    while that pid cannot belong to anyone else: the leader is not reaped yet, or members of the
    group remain (Linux never hands out an id a live group has)."""
    if process.returncode is None or _group_alive(process.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)


def _group_alive(group: int) -> bool:
    """Some process of the group still runs (zombies waiting for their parent do not count)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            return True
    return False
