"""Where a policy's TTFT goes, request by request, against the ``ideal`` floor.

For every completed request that arrived in the measurement window: its TTFT under the policy
and under ``ideal`` (alone on an idle instance that holds every block any earlier request
carried), the prompt tokens it found cached, and the most of its prompt any instance of the
fleet held when it reached the router (the engines' own caches, read at that instant).

A request *lost its cache* when ``ideal`` found at least ``LOST_TOKENS`` more of its prompt
cached than it did. The cause is *routing* if some instance held at least that much more than
it found when it was decided, else *capacity*: no instance held it any more (evicted
everywhere) — no placement of that request could have found it.

Also reported: the *duplication* of the fleet's cache (share of the resident blocks that are a
second or later copy of a block, sampled every ``SAMPLE_EVERY`` decisions: the most a router
that avoided copies could win back as room), and the policy's TTFT quantiles three more times:

- every lost request's cache restored (its wait to be scheduled kept, its prefill as
  ``ideal``'s): what the caches lost to capacity and routing cost the tail;
- only the caches lost to routing restored: what a better placement could win back, its
  queueing aside;
- that, less each request's wait until its first chunk was scheduled: roughly the least a
  router that leaves the engines' caches to them could reach with this workload and fleet.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from agents.policy.registry import StageParams, params_for
from sim.engine.attempt import Attempt
from sim.engine.fleet import FleetSpec
from sim.evaluation.ideal import ideal_attempts
from sim.evaluation.metrics import measurement_window, percentile
from sim.loop.config import SimConfig
from sim.loop.deciders import scheduler_for
from sim.loop.runner import Simulation
from sim.workloads.trace import Workload

LOST_TOKENS = 8192
"""Cached prompt tokens ``ideal`` found beyond the policy's for a request to count as lost."""
SAMPLE_EVERY = 200
"""Decision batches between two duplication samples (by default)."""
TAIL_PERCENTILES = (50.0, 95.0, 99.0)
"""The TTFT percentiles the analysis reports (``metrics.QUANTILES``: those the simulate JSON keeps)."""

Key = tuple[str, int]


class _Witness(Simulation):
    """The simulation, noting at every decision the deepest match any engine's cache holds."""

    def __init__(
        self,
        workload: Workload,
        fleet: FleetSpec,
        policy: str,
        config: SimConfig,
        params: StageParams | None,
        sample_every: int,
    ) -> None:
        scheduler = scheduler_for(policy, fleet, config, params_for(policy, params))
        super().__init__(workload, fleet, scheduler, config)
        self.best_held: dict[Key, int] = {}  # prompt tokens, per attempt
        self.copies: list[tuple[int, int]] = []  # (distinct blocks, resident blocks) per sample
        self._batches = 0
        self._sample_every = sample_every

    def _offer(self, attempts: list[Attempt], now: float) -> None:
        caches = [instance.cache for instance in self.instances]
        for attempt in attempts:
            blocks = attempt.request.block_hashes
            held = attempt.request.reusable_tokens(max((cache.match(blocks) for cache in caches), default=0))
            self.best_held[(attempt.request.request_id, attempt.attempt)] = held
        self._batches += 1
        if self._batches % self._sample_every == 0:
            resident = [cache.resident_blocks() for cache in caches]
            self.copies.append((len(set().union(*resident)), sum(len(r) for r in resident)))
        super()._offer(attempts, now)


@dataclass(frozen=True, slots=True)
class Tail:
    """The measures of the module docstring for one policy run."""

    policy: str
    requests: int
    ttft_s: dict[str, float | None]  # by quantile name ("p50", ...)
    ideal_ttft_s: dict[str, float | None]
    lost_to_capacity: int
    lost_to_routing: int
    lost_tokens: int  # prompt tokens the lost requests prefilled that ideal found cached
    duplication: float | None  # mean share of resident blocks that are extra copies
    restored_ttft_s: dict[str, float | None]  # the policy's, every lost cache restored
    rerouted_ttft_s: dict[str, float | None]  # the policy's, the caches lost to routing restored
    unqueued_ttft_s: dict[str, float | None]  # that, less each request's wait to be scheduled


def analyse(
    workload: Workload,
    fleet: FleetSpec,
    policy: str,
    config: SimConfig,
    params: StageParams | None = None,
    sample_every: int = SAMPLE_EVERY,
) -> Tail:
    """Run ``policy`` once (as ``simulate`` does) and ``ideal`` beside it; measure the tail."""
    sim = _Witness(workload, fleet, policy, config, params, sample_every)
    run = sim.run()
    window = measurement_window(run.attempts, run.window)
    ideal = {
        (a.request.request_id, a.attempt): a
        for a in ideal_attempts(workload, fleet, config.budget_for, run.window[1])
    }
    ttft, floor, restored, rerouted, unqueued = [], [], [], [], []
    capacity = routing = lost_tokens = 0
    for attempt in run.attempts:
        if attempt.status != "ok" or attempt.first_token_s is None or attempt.admitted_s is None:
            continue
        if not window[0] <= attempt.arrival_s < window[1]:
            continue
        own = attempt.first_token_s - attempt.arrival_s
        wait = attempt.admitted_s - attempt.arrival_s  # until its first chunk was scheduled
        with_cache = by_routing = own
        best = ideal.get((attempt.request.request_id, 1))
        if best is not None and best.first_token_s is not None:
            alone = best.first_token_s - best.arrival_s
            floor.append(alone)
            lost = best.cached_tokens - attempt.cached_tokens
            if lost >= LOST_TOKENS:
                lost_tokens += lost
                with_cache = min(own, wait + alone)
                held = sim.best_held.get((attempt.request.request_id, attempt.attempt), 0)
                if held - attempt.cached_tokens >= LOST_TOKENS:
                    routing += 1
                    by_routing = with_cache
                else:
                    capacity += 1
        ttft.append(own)
        restored.append(with_cache)
        rerouted.append(by_routing)
        unqueued.append(by_routing - wait)
    copies = [1.0 - distinct / resident for distinct, resident in sim.copies if resident]
    return Tail(
        policy,
        len(ttft),
        _quantiles(ttft),
        _quantiles(floor),
        capacity,
        routing,
        lost_tokens,
        round(sum(copies) / len(copies), 4) if copies else None,
        _quantiles(restored),
        _quantiles(rerouted),
        _quantiles(unqueued),
    )


def to_json(tail: Tail) -> dict[str, Any]:
    return {**asdict(tail), "lost_tokens_threshold": LOST_TOKENS}


def _quantiles(values: list[float]) -> dict[str, float | None]:
    return {
        f"p{q:.0f}": None if (v := percentile(values, q)) is None else round(v, 4) for q in TAIL_PERCENTILES
    }


def format_tail(tail: Tail) -> str:
    def row(name: str, quantiles: dict[str, float | None]) -> str:
        cells = "  ".join(f"{k} {'-' if v is None else f'{v:.3f}'}" for k, v in quantiles.items())
        return f"  {name:<34} {cells}"

    lost = tail.lost_to_capacity + tail.lost_to_routing
    duplication = "-" if tail.duplication is None else f"{tail.duplication:.1%}"
    return "\n".join(
        [
            f"{tail.policy}: {tail.requests} requests completed in the window; TTFT, s:",
            row(tail.policy, tail.ttft_s),
            row("ideal (unlimited cache, no queue)", tail.ideal_ttft_s),
            row("  those lost to routing restored", tail.rerouted_ttft_s),
            row("    and no wait to be scheduled", tail.unqueued_ttft_s),
            row("  every lost cache restored", tail.restored_ttft_s),
            f"  lost cache (>= {LOST_TOKENS} prompt tokens fewer cached than ideal): {lost} requests,"
            f" {tail.lost_tokens / 1e6:.1f} M tokens; held by no instance when decided (capacity):"
            f" {tail.lost_to_capacity}, held by another instance (routing): {tail.lost_to_routing}",
            f"  fleet cache duplication (resident blocks that are extra copies): {duplication}",
        ]
    )
