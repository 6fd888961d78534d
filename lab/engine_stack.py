"""TokenFleet in front of real engines, on one machine: a worker, the dispatcher and the gateway.

``EngineStack`` starts, over a broker and an engine inventory (a file): a worker process (the
scheduler; it takes the models' tokenizers from the inventory), the dispatcher over the
inventory's vLLM servers (heartbeats from their ``/metrics``, KV events, Kafka-published
requests) and the OpenAI-compatible gateway, the last two in this process's event loop. It is
ready once the worker consumes, the dispatcher has its partitions and every instance has been
heard from (so the first request is routed on real load, not held). ``tokenfleet demo --engine
vllm`` and the real-engine tests run it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from dispatcher.engines.vllm.adapter import VllmEngines
from dispatcher.service import FleetCounts
from gateway.auth import Authenticator
from gateway.server import Gateway, GatewayOptions, serve
from infra.kafka.broker import free_port
from infra.kafka.connection import KafkaConnection
from infra.prompts import Prompts
from infra.vllm.inventory import load_inventory
from lab.stack import Dispatcher, WorkerOptions, start_worker
from lab.worker_process import WorkerProcess


@dataclass
class StackOptions:
    policy: str = "tokenpilot"
    scrape_s: float = 0.25
    heartbeat_s: float = 0.25
    clickhouse: str = "off"  # the worker's TOKENFLEET_CLICKHOUSE_DSN ("off": no feedback store)
    gateway_port: int = 0  # 0: any free port
    worker_settings: dict[str, str] = field(default_factory=dict)
    app_id: str = "tokenfleet-engines"
    # The gateway takes each call's tenant from X-TokenFleet-Tenant, as behind an authenticating
    # proxy (the demo's users are tenants); otherwise it runs open (every call tenant "default").
    trust_tenant_header: bool = False


def worker_options(inventory_path: Path, options: StackOptions) -> WorkerOptions:
    """The worker scheduling the engines of ``inventory_path``: its pools are the inventory's
    models, its tokenizers the inventory's."""
    models = sorted({i.model for i in load_inventory(inventory_path).instances})
    return WorkerOptions(
        app_id=options.app_id,
        policy=options.policy,
        clickhouse=options.clickhouse,
        web_port=0,
        loglevel="info",
        env={
            "TOKENFLEET_INVENTORY": str(inventory_path.resolve()),
            "TOKENFLEET_POOLS": "[" + ",".join(f'"{m}"' for m in models) + "]",
            "TOKENFLEET_HEARTBEAT_INTERVAL_S": str(options.heartbeat_s),
            # The lab runs one scheduler after another on one broker (a policy each), on purpose;
            # the embedded broker lists a stopped one's group member for a while after it left.
            "TOKENFLEET_REFUSE_OTHER_SCHEDULERS": "false",
            **options.worker_settings,
        },
    )


class EngineStack:
    def __init__(
        self, bootstrap: str, inventory_path: Path, data_dir: Path, options: StackOptions | None = None
    ):
        self.bootstrap = bootstrap
        self.inventory_path = inventory_path
        self.inventory = load_inventory(inventory_path)
        self.data_dir = data_dir
        self.options = options or StackOptions()
        self.engines = VllmEngines(self.inventory, scrape_s=self.options.scrape_s)
        self.port = self.options.gateway_port or free_port()
        self.worker: WorkerProcess | None = None
        self.dispatcher: Dispatcher | None = None
        self.fleet_counts: FleetCounts | None = None
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[object]] = []

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> EngineStack:
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _start(self) -> None:
        self.worker = start_worker(
            self.bootstrap,
            self.data_dir / "worker",
            worker_options(self.inventory_path, self.options),
        )
        self.dispatcher = Dispatcher(
            self.bootstrap,
            self.engines,
            heartbeat_s=self.options.heartbeat_s,
            group_id=f"{self.options.app_id}-dispatcher",
        )
        await self.dispatcher.start(timeout_s=60)
        self.gateway = Gateway(
            KafkaConnection.plaintext(self.bootstrap),
            self.inventory,
            Prompts.from_dirs(self.inventory.tokenizer_dirs()),
            GatewayOptions(app_id=self.options.app_id),
            auth=Authenticator("proxy") if self.options.trust_tenant_header else Authenticator.open(),
        )
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(serve(self.gateway, "127.0.0.1", self.port, self._stop)))
        await self.worker.wait_ready_async(timeout_s=120)
        await self._until_heard_from_every_engine(60)
        await self._until_gateway_answers(30)

    async def _until_heard_from_every_engine(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            ready = self.engines.readiness()
            if all(ready.values()):
                break
            if time.monotonic() > deadline:
                silent = [name for name, ok in ready.items() if not ok]
                raise RuntimeError(f"engines not ready after {timeout_s:.0f} s: {silent}")
            await asyncio.sleep(0.1)
        await asyncio.sleep(3 * self.options.heartbeat_s + 1.0)  # their heartbeats reached the worker

    async def _until_gateway_answers(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.dispatcher is not None:
                self.dispatcher.check()  # a crashed dispatcher raises here
            for task in self._tasks:
                if task.done():
                    task.result()  # a crashed gateway raises here
            with contextlib.suppress(OSError):
                _reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"the gateway did not listen on port {self.port} within {timeout_s:.0f} s")

    async def close(self) -> None:
        self._stop.set()
        for task in self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 15)
        self._tasks = []
        if self.dispatcher is not None:
            self.fleet_counts = await self.dispatcher.stop()
            self.dispatcher = None
        if self.worker is not None:
            self.worker.stop()
            self.worker = None
