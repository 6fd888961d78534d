"""Minimal reproduction: how long the embedded broker takes to hand a new record to a consumer.

``python -m bench.broker [--rate R] [--seconds S] [--waits 10,50,100]``

Nothing of TokenFleet runs: a fresh Tansu broker, one aiokafka producer sending ~900-byte
records at ``--rate`` per second (4 partitions, ``linger_ms=5``), and one aiokafka consumer
(``fetch_min_bytes=1``) with each ``fetch_max_wait_ms`` in ``--waits``, all in this process.
Printed per wait: the delay from the producer's acknowledgement (the record is in the log) to
the consumer receiving it, p50 / p99.

Why: on Kafka a fetch with ``fetch_min_bytes=1`` returns as soon as a record arrives, so this
delay does not depend on ``fetch_max_wait_ms``. On Tansu 0.6 it grows with it (a fetch that
finds nothing new is held, and new records do not end the hold early), which sets a floor
under every consumer's latency, the worker's included, and makes short waits the only lever
(each empty fetch then costs both sides CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from infra.kafka.broker import ensure_topics
from infra.kafka.connection import KafkaConnection
from lab.stack import broker
from sim.evaluation.metrics import percentile

PARTITIONS = 4
PAYLOAD = b"x" * 900


async def measure(bootstrap: str, topic: str, rate: float, seconds: float, wait_ms: int) -> list[float]:
    """Ack -> received delays (seconds) of every record sent at ``rate`` for ``seconds``."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=wait_ms, fetch_min_bytes=1)
    await producer.start()
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_end(*partitions)
        acked: dict[bytes, float] = {}
        received: dict[bytes, float] = {}

        async def consume() -> None:
            while True:
                batches = await consumer.getmany(timeout_ms=100)
                now = time.time()
                for records in batches.values():
                    for record in records:
                        assert record.key is not None
                        received[record.key] = now

        reader = asyncio.create_task(consume())
        await asyncio.sleep(0.5)  # the consumer's first fetches are out
        start, sent = time.monotonic(), 0
        while (elapsed := time.monotonic() - start) < seconds:
            while sent < int(elapsed * rate):
                key = str(sent).encode()
                delivery = await producer.send(topic, PAYLOAD, key=key, partition=sent % PARTITIONS)
                delivery.add_done_callback(lambda _, key=key: acked.__setitem__(key, time.time()))
                sent += 1
            await asyncio.sleep(0.001)
        await asyncio.sleep(max(1.0, 3 * wait_ms / 1000))
        reader.cancel()
        missing = sent - len(received)
        if missing:
            raise RuntimeError(f"{missing} of {sent} records never reached the consumer")
        return [received[key] - acked[key] for key in acked]
    finally:
        await consumer.stop()
        await producer.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=4600.0, help="records per second")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--waits", default="10,50,100", help="fetch_max_wait_ms values, comma-separated")
    args = parser.parse_args(argv)
    waits = [int(w) for w in args.waits.split(",")]
    print(f"embedded broker, {args.rate:,.0f} records/s for {args.seconds:.0f} s, nothing else running")
    print(f"{'fetch_max_wait_ms':>18} {'ack -> received p50':>20} {'p99':>8}")
    with broker(topics=()) as bootstrap:  # the benchmark's own topics only, below
        for wait_ms in waits:
            topic = f"lag-{wait_ms}"
            ensure_topics(KafkaConnection.plaintext(bootstrap), PARTITIONS, [topic])
            delays = asyncio.run(measure(bootstrap, topic, args.rate, args.seconds, wait_ms))
            p50, p99 = (1e3 * _or_nan(percentile(delays, q)) for q in (50, 99))
            print(f"{wait_ms:>18} {p50:>17.1f} ms {p99:>5.1f} ms", flush=True)
    return 0


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


if __name__ == "__main__":
    raise SystemExit(main())
