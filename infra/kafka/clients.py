"""Kafka client helpers shared by the fleet, the load generator and the benchmarks."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from aiokafka.errors import KafkaError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_random_exponential

from schemas.codec import encode
from schemas.events import Event
from schemas.topics import TopicSpec, key_of

log = logging.getLogger(__name__)


class _Client(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


ClientT = TypeVar("ClientT", bound=_Client)


async def start_client(factory: Callable[[], ClientT], what: str, timeout_s: float = 30.0) -> ClientT:
    """Build and start a Kafka client, retrying (fresh client each time) while the broker is
    still coming up; re-raises the last error after ``timeout_s``."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(KafkaError),
        stop=stop_after_delay(timeout_s),
        wait=wait_random_exponential(multiplier=0.2, max=2),
        reraise=True,
    ):
        with attempt:
            client = factory()
            try:
                await client.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    await client.stop()
                raise
            if attempt.retry_state.attempt_number > 1:
                log.info("%s connected after %d attempts", what, attempt.retry_state.attempt_number)
            return client
    raise AssertionError("unreachable: AsyncRetrying re-raises")


async def send_event(producer: Any, spec: TopicSpec, event: Event) -> Awaitable[Any]:
    """Queue ``event`` on ``spec``'s topic (JSON, keyed); returns the delivery future."""
    future: Awaitable[Any] = await producer.send(spec.name, encode(event), key=key_of(spec, event))
    return future
