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
  run (read once the last worker stopped: the embedded engine admits one process at a time;
  the workers are stopped once the store's consumer group committed ``tf.completions`` to its
  end, bounded: ``Run.store_caught_up``, so a store consumer still behind is waited for, not
  counted as a loss);
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

The gateway path (``gateway_*`` scenarios, ``lab.faults.gateway_harness``): each runs on a
stack started as a user starts it (``local.up``: ``tokenfleet up --engines emulated
--servers 2 --policy slomax+tokenpilot``; ``gateway_vllm_engine_kill``: ``--engines local``,
two vLLM CPU servers), brought down after; ~300 calls of the official ``openai`` client at
concurrency 6 (``lab.faults.gateway_clients``: its timeouts and retries) go through the
gateway while one part is killed by its pid in ``state.json`` and ``up``'s supervisor (or the
worker's, for its decider) starts it again. The columns, for these: ``published``: (request
id, attempt) the deciders recorded on ``tf.requests``; ``decided_*``, ``executed_twice``,
``lost``, ``dead_lettered``, ``completions_*``, ``decided_not_executed``, ``recovered_s``:
as above over those keys (the store: the stack's workers' embedded stores, read after
``down``); ``routing_p99_s``: null (the direct lane records a request as its decision leaves);
``never_answered``: calls whose client still waited when the run ended. The figures at the
client (``lab.faults.gateway_tally``; a call is one ``create()`` under its own
``x-request-id``, an attempt one HTTP try of it, an *answer start* an attempt answered 200):

- ``calls``, ``calls_failed`` (the client raised after its own retries; of them
  ``calls_failed_mid_answer``: streamed calls whose stream broke after part of the answer had
  reached the client, e.g. their engine was killed; ``failed_by``: what
  it raised), ``client_retries`` (attempts beyond each call's first; ``retried_after``: what
  the retried attempts got);
- ``answered_twice``: call ids with more than one attempt answered 200;
  ``answered_under_other_id``: answers not carrying their call's id;
- ``blind_s`` / ``blind_longest_s``: seconds, from the fault on, in which calls waited (from
  their start to their first answer start or their failure, back-off included) and no answer
  start came for at least ``BLIND_AFTER_S`` (2 s): the stack could not answer;
  ``resumed_s``: from the faulted part's return (``fault_end``) to the end of the last such
  stretch (0: answers were flowing by then); ``answer_p99_s``: p99 of call start -> answer
  start over the calls started from 1 s before the fault to 15 s after the part's return;
- ``ready_200_while_blind_s`` / ``ready_503_while_answering_s``: seconds of the traffic in
  which the gateway's ``/ready`` (polled every 0.25 s; no answer is not ready) said 200 while
  blind, or not 200 while answers came; ``status_ready_while_blind_s``: seconds ``tokenfleet
  status`` (``local.refresh``, every 1 s) showed every part ready while blind;
- ``engine_starts``: calls the engines started (emulated: ``/debug/served`` by request id;
  vLLM: ``vllm:request_success_total``), over every engine process; ``attempts_placed``:
  (request id, attempt) with a routing decision; ``engine_started_twice``: calls an engine
  started more often than attempts of theirs were placed (an attempt ran twice; an attempt
  re-placed after its engine died is a placement of its own); null when the engines cannot
  name the calls (then ``engine_starts_beyond_placed``: the surplus of the totals);
- per scenario: ``held`` / ``failed_held`` / ``failed_not_held`` / ``gateway_down_s``
  (gateway_kill), ``survivor_gap_s`` / ``takeover_gap_s`` (gateway_two_deciders, as above),
  ``decider_restarts_in_status``, ``log_end_at_kill_*`` / ``broker_down_s`` /
  ``completions_missing_with_broker_log`` (gateway_broker_restart), ``p99_alone_s`` /
  ``p99_held_s`` / ``p99_alone_again_s`` / ``slow_cut`` / ``slow_cut_after_s`` /
  ``idle_cut_while_held`` (gateway_slow_clients), ``engine_processes_seen``.
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
