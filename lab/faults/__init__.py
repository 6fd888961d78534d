"""The fault suite: what the control plane does under bad input, crashes and outages, in figures.

Not a test: every scenario (``lab/faults/scenarios/``, one module each) runs on a fresh stack
(``lab.stack``): a fresh embedded broker (Tansu) and data dir, ``tokenfleet worker`` processes
(the embedded ClickHouse store unless said otherwise), the emulated fleet ``FLEET`` in this
process, a publisher and one collector that reads ``tf.decisions``, ``tf.admission``,
``tf.completions`` and ``tf.dlq`` from their start (``lab.faults.harness``). A scenario that
fails keeps its figures so far and gets an ``"error"``; the suite goes on. Every wait is bounded;
every process started is stopped. ``python -m bench.faults`` runs them and prints the figures.

How each figure is counted (``null`` where it does not apply; ``lab.faults.tally`` and
``Run.figures``):

- ``published``: valid requests the broker acknowledged (warm-up requests excluded; a send the
  broker never acknowledged was not published). Bad messages are ``bad_published``.
- ``decided_once`` / ``decided_twice``: routing decisions on ``tf.decisions`` per
  (request_id, attempt) of the valid requests published: how many keys got exactly one, how
  many two or more (distinct decision event ids: one record read twice is one decision).
- ``executed_twice``: (request_id, attempt) of valid requests with two or more completions
  (distinct event ids) on ``tf.completions``: the fleet ran the attempt more than once.
- ``lost``: valid requests published with neither a routing decision nor a ``reject`` on
  ``tf.admission``; after a broker restart only those the broker still serves at the end (what
  the broker itself lost is counted apart, see ``Run.broker_audit``).
- ``dead_lettered``: records on ``tf.dlq``; ``bad_not_dead_lettered`` counts the bad messages
  published whose SHA-256 no dead letter carries (the fuzz and poison scenarios), and
  ``valid_dead_lettered`` the valid requests that were dead-lettered.
- ``completions_stored``: distinct completion event ids in ClickHouse ``completions`` after the
  run (read once the last worker stopped: the embedded engine admits one process at a time);
  ``completions_expected``: distinct completion event ids seen on ``tf.completions`` (warm-up
  included: the store keeps those too).
- ``routing_p99_s``: p99 (nearest rank) of decision record timestamp - request record
  timestamp (the broker's acknowledgement metadata, CreateTime) over the valid requests
  published inside the scenario's fault window (below); a request never decided is left out
  (it is ``lost``).
- ``recovered_s``: first decision record timestamp after the end of the fault - that end.
  ``outage_s`` (worker_kill, broker_restart): the same from the *start* of the fault.

Extra figures where they apply: ``survivor_gap_s`` / ``takeover_gap_s`` (decider_failover,
decider_join: the longest routing pause on partitions a worker kept through the change, and on
the partitions that changed hands; see the scenarios), ``workers_deciding``, ``rejected``
(valid requests rejected), ``held_at_end`` (valid
requests never decided whose last admission answer is ``queue``: held, counted in ``lost``),
``send_failed`` (sends the broker never acknowledged), ``fleet_error`` / ``fleet_died_at_s``
(the in-process fleet stopped with an error, seconds into the scenario), ``outage_s``,
``completions_missing`` (seen on ``tf.completions``, not in the store), broker_restart's audit of
what the broker lost (``lost_with_broker_log``, ``lost_unserved_by_new_broker``,
``broker_offset_collisions``, ``decided_not_executed_unserved_by_new_broker``,
``completions_missing_with_broker_log``, ``completions_missing_unserved_by_new_broker``,
``completions_missing_at_broker_collisions``, ``decided_not_executed_at_broker_collisions`` (at
an offset where the new broker holds two records: a live consumer reads one and moves past the
other), ``completions_missing_with_broker_losses`` (all of them; ``completions_missing`` then
counts only what the system lost): see
``Run.broker_audit``), ``routing_p99_control_s`` / ``routing_p99_ratio`` / ``routing_p99_before_s`` /
``routing_p99_after_s`` (store_down_mid_run),
``decided_not_executed`` (decided valid requests with no completion on ``tf.completions``;
broker_restart also ``..._before_restart``: those decided on the old broker),
``spool_*`` (store_down_at_start, store_down_mid_run), ``decided_after_last_pill`` (poison),
``note`` (a scenario not run, and why), ``error`` (a scenario that failed: its figures are those so
far), ``seconds``.

Fault windows: ``baseline``, ``fuzz``, ``poison``: the publishing period (poison: its end is
the last pill's acknowledgement); ``worker_kill``: kill -9 -> the replacement is ready;
``held_restart``: first held request -> the fleet's first heartbeat after the restart;
``store_down_at_start``: first request -> the worker with the embedded store is ready;
``store_down_mid_run``: the store's calls start failing -> they succeed again;
``broker_restart``: the old broker stopped -> the new one listens with its topics.

After a broker restart the collector (the measuring apparatus, not the system under test)
starts a new consumer from offset 0 of the new log, keeping what it saw before; the publisher's
producer, the worker and the fleet are left to reconnect on their own.
"""

from __future__ import annotations

import sys

FLEET = "2xllama3-8b-h100"
MODEL = "llama3-8b"  # the pool of that fleet
PARTITIONS = 4
RATE_PER_S = 40.0  # steady valid traffic: far below what 2 emulated instances serve
MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # room for the 5 MB pill
SCENARIO_LIMIT_S = 600.0  # a scenario that runs longer is cancelled (its figures so far kept)


def log(text: str) -> None:
    """Progress, on stderr (the figures go to stdout)."""
    print(f"[faults] {text}", file=sys.stderr, flush=True)
