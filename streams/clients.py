"""Starting and stopping the stream's own aiokafka clients, written once for every reader.

A reader that reads on a consumer of its own (the request lane, the shared log, the deciders'
group, the store's sink) starts the consumer, then one task that reads it; it stops them the
other way round: the task first (cancelled, awaited), then the consumer, without hanging on a
broker that is gone (``stop_client``). ``ConsumerLoop`` is that pair. The dispatcher stops its
clients with ``stop_client`` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0


async def stop_client(client: Any, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop an aiokafka client (consumer, producer, admin) within ``timeout_s``, whatever the
    broker does; errors are swallowed (the client is given up either way). aiokafka's consumer
    can raise the ``CancelledError`` of its own fetch task from ``stop`` (a fetch was retrying
    against a lost broker): that one is swallowed too; a cancellation of the caller's task is
    not."""
    try:
        await asyncio.wait_for(client.stop(), timeout_s)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
    except Exception:
        pass


class ConsumerLoop:
    """An aiokafka consumer and the one task that reads it, started and stopped together.

    ``what`` names the reader in the log line that reports a task that ended on an error (a
    reader's loop is meant to run until it is cancelled). ``options``: the
    ``AIOKafkaConsumer`` keyword arguments. ``consumer`` is ``None`` before ``start`` and after
    ``stop``."""

    def __init__(self, what: str, options: Mapping[str, Any]) -> None:
        self.what = what
        self.options = dict(options)
        self.consumer: Any = None
        self.task: asyncio.Task[None] | None = None

    async def start(
        self,
        run: Callable[[], Coroutine[Any, Any, None]],
        topics: Sequence[str] = (),
        listener: ConsumerRebalanceListener | None = None,
    ) -> None:
        """Start the consumer (inside the running event loop), subscribe it to ``topics`` (a
        group member, ``listener`` told of its rebalances) if any are given (otherwise its owner
        assigns partitions by hand), then start ``run`` as the reading task."""
        consumer = AIOKafkaConsumer(**self.options)
        await consumer.start()
        if topics:
            consumer.subscribe(list(topics), listener=listener)
        self.consumer = consumer
        self.task = asyncio.create_task(run())
        self.task.add_done_callback(self._report_crash)

    @property
    def running(self) -> bool:
        """Started, and its task has not ended."""
        return self.task is not None and not self.task.done()

    async def stop_reading(self) -> None:
        """Cancel the reading task and wait until it ended; the consumer stays (to commit)."""
        task = self.task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """``stop_reading``, then stop the consumer (a group member leaves its group: the others
        take its partitions at once) within ``timeout_s``."""
        await self.stop_reading()
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            await stop_client(consumer, timeout_s)

    def _report_crash(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s stopped: %r", self.what, task.exception(), exc_info=task.exception())
