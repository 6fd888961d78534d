"""A seeded synthetic mix of multi-tenant traffic, written in the Mooncake JSONL format.

Four kinds of traffic, over bursty arrivals (a two-state Markov-modulated Poisson process: calm
and burst phases with exponential durations, the burst rate ``burst_factor`` times the calm one):

- chat sessions (``chat``, interactive): each tenant has a system prompt; a session's prompt is
  the system prompt plus the whole history, growing turn by turn (think time between turns);
- long-document Q&A (``doc_qa``): questions over a shared pool of documents (Zipf popularity);
  documents over 32k tokens make ``long_context`` requests;
- one-off API calls (``api``, interactive): a short tenant prefix, the rest unique;
- offline batch jobs (``batch``): many requests submitted at once, sharing a job instruction,
  with one deadline.

Block ids are allocated from disjoint ranges so equal ids mean equal content; the loader chains
them, so a block is shared only when its whole prefix is.

Several models: ``models`` names them, each ``NAME`` or ``NAME@VERSION``; tenant k asks for
``models[k mod len(models)]`` (its ``model``, and its ``model_version`` when one is named), so a
tenant's sessions stay with one model. Empty (the default): no request names a model (each runs
on the fleet's default model) and the records are exactly those of a mix without the option.

A day of several models (``swing`` > 0, or ``model_shares`` given): each model m (the tenants k
with ``k mod n == m``, n = ``len(models)``, or one group of all tenants when ``models`` is empty)
is a mix of its own, with its own bursts, whose mean rate follows a daily cosine::

    rate_m(t) = rate_per_s * share_m * (1 + swing * cos(2 pi (t / day_s - phase_m)))

times the burst factor of its MMPP (calm ``2 / (1 + burst_factor)``, burst ``burst_factor``
times that). Every kind of the model's traffic follows it (chat sessions start, document
questions, API calls, batch job submissions at ``batch_jobs_per_hour * share_m`` on average);
the turns of a session already started keep their think time. Model m peaks at
``phase_m * day_s`` (and every ``day_s`` after), at ``(1 + swing)`` times its mean, and bottoms
out half a day later at ``(1 - swing)`` times it; over whole days its mean is
``rate_per_s * share_m``. The shape is that of Dynamo's sinusoidal load generator
(ai-dynamo/dynamo, ``benchmarks/sin_load_generator/sin_synth.py``: a rate moving between a min
and a max along a sine, here ``swing = (max - min) / (max + min)``), but drawn exactly, by
thinning (Lewis and Shedler): candidates of the MMPP at ``(1 + swing)`` times the mean, each
kept with probability ``level_m(t) / (1 + swing)`` where ``level_m`` is the bracket above.

- ``day_s``: length of one simulated day in seconds; 0 (the default) means ``duration_s``.
- ``swing`` in [0, 1]: 0 is no daily swing; 1 makes a model silent at its trough.
- ``phases``: each model's peak time as a fraction of the day, in [0, 1]; default evenly spread,
  ``phase_m = (m + 0.5) / n``, so no model peaks at the very start or end of a one-day run.
- ``model_shares``: each model's share of the mean rate (normalised to sum 1); default the share
  of the tenants that ask for it (equal shares when ``tenants`` is a multiple of n).

With ``swing`` 0 and no ``model_shares`` the records are exactly those of a mix without these
options; ``day_s`` and ``phases`` alone change nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.policy.types import BLOCK_TOKENS

Record = dict[str, Any]

MAX_TRAFFIC_S = 1e7
MAX_RATE_PER_S = 1e5
MAX_REQUESTS = 1e7
"""Bounds of the mix: at most 10^7 s of traffic, 10^5 requests/s, 10^7 requests expected."""


def _check(name: str, value: float, low: float, high: float, low_open: bool = True) -> None:
    """``value`` finite, in (low, high] (or [low, high]); else ``ValueError`` naming the option."""
    ok = math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise ValueError(
            f"synthetic {name} must be a finite number in {bracket}{low:g}, {high:g}], got {value}"
        )


_SYSTEM_BASE = 1_000_000
_DOC_BASE = 2_000_000
_JOB_BASE = 3_000_000
_UNIQUE_BASE = 10_000_000


@dataclass(frozen=True, slots=True)
class SyntheticMix:
    duration_s: float = 600.0
    rate_per_s: float = 4.0
    seed: int = 0
    tenants: int = 6
    documents: int = 24
    share_chat: float = 0.5
    share_doc_qa: float = 0.2
    share_api: float = 0.3
    batch_jobs_per_hour: float = 6.0
    batch_job_size: tuple[int, int] = (40, 160)
    burst_factor: float = 3.0
    mean_phase_s: float = 60.0
    models: tuple[str, ...] = ()  # NAME or NAME@VERSION; tenant k asks for models[k mod len]
    day_s: float = 0.0  # one simulated day; 0 means duration_s
    swing: float = 0.0  # daily swing of each model's rate, in [0, 1]
    phases: tuple[float, ...] = ()  # per model: its peak as a fraction of the day
    model_shares: tuple[float, ...] = ()  # per model: its share of the mean rate

    def __post_init__(self) -> None:
        """``ValueError`` naming the first option out of range (NaN and infinities included)."""
        _check("duration_s", self.duration_s, 0.0, MAX_TRAFFIC_S)
        _check("rate_per_s", self.rate_per_s, 0.0, MAX_RATE_PER_S)
        if self.rate_per_s * self.duration_s > MAX_REQUESTS:
            raise ValueError(
                f"synthetic rate_per_s x duration_s must be at most {MAX_REQUESTS:.0e} requests, "
                f"got {self.rate_per_s * self.duration_s:.3g}"
            )
        if self.seed < 0:
            raise ValueError(f"synthetic seed must be >= 0, got {self.seed}")
        if self.tenants < 1 or self.documents < 1:
            raise ValueError("synthetic tenants and documents must be >= 1")
        for name in ("share_chat", "share_doc_qa", "share_api"):
            _check(name, getattr(self, name), 0.0, 1.0, low_open=False)
        if self.share_chat + self.share_doc_qa + self.share_api <= 0:
            raise ValueError("synthetic shares must not all be 0")
        _check("batch_jobs_per_hour", self.batch_jobs_per_hour, 0.0, 3600.0, low_open=False)
        _check("burst_factor", self.burst_factor, 0.0, 1000.0)
        _check("mean_phase_s", self.mean_phase_s, 0.0, MAX_TRAFFIC_S)
        if not isinstance(self.models, tuple) or not all(
            isinstance(m, str) and m.partition("@")[0] and not m.endswith("@") for m in self.models
        ):
            raise ValueError(f"synthetic models must be a list of NAME or NAME@VERSION, got {self.models!r}")
        low, high = self.batch_job_size
        if not 1 <= low < high <= 100_000:
            raise ValueError(
                f"synthetic batch_job_size must be (low, high) with 1 <= low < high, got {low, high}"
            )
        self._check_day()

    def _check_day(self) -> None:
        """The options of a day of several models (module docstring)."""
        _check("day_s", self.day_s, 0.0, MAX_TRAFFIC_S, low_open=False)
        _check("swing", self.swing, 0.0, 1.0, low_open=False)
        groups = max(1, len(self.models))
        for name in ("phases", "model_shares"):
            values = getattr(self, name)
            if not isinstance(values, tuple) or (values and len(values) != groups):
                raise ValueError(
                    f"synthetic {name} must be a list of one number per model ({groups}), got {values!r}"
                )
            for value in values:
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ValueError(f"synthetic {name} must be numbers, got {value!r}")
                high = 1.0 if name == "phases" else MAX_RATE_PER_S
                _check(name, float(value), 0.0, high, low_open=False)
        if self.model_shares and sum(self.model_shares) <= 0:
            raise ValueError("synthetic model_shares must not all be 0")
        if self.has_day and self.tenants < groups:
            raise ValueError(
                f"synthetic tenants must be >= the number of models ({groups}) with swing or model_shares"
            )

    @property
    def has_day(self) -> bool:
        """True when each model has its own curve (``swing`` > 0 or ``model_shares`` given)."""
        return self.swing > 0 or bool(self.model_shares)

    def generate(self) -> list[Record]:
        """All requests, sorted by timestamp (ms)."""
        rng = np.random.default_rng(self.seed)
        gen = _Generator(self, rng)
        records = list(gen.interactive()) + list(gen.batch_jobs())
        records.sort(key=lambda r: (r["timestamp"], r["request_id"]))
        return records


@dataclass(frozen=True, slots=True)
class _Group:
    """Tenants whose traffic shares one daily curve: ``share`` of the mix's rates, peaking at
    ``phase`` (a fraction of the day); ``phase`` None is a flat rate (no day)."""

    tenants: tuple[int, ...]
    share: float = 1.0
    phase: float | None = None


class _Generator:
    def __init__(self, mix: SyntheticMix, rng: np.random.Generator) -> None:
        self.mix = mix
        self.rng = rng
        self.next_unique = _UNIQUE_BASE
        self.system_blocks = [int(rng.integers(2, 9)) for _ in range(mix.tenants)]
        self.max_tokens = [int(rng.choice([512, 1024, 2048])) for _ in range(mix.tenants)]
        self.doc_tokens = [
            int(rng.choice([8_000, 16_000, 24_000, 48_000, 80_000])) + int(rng.integers(0, 4000))
            for _ in range(mix.documents)
        ]
        ranks = np.arange(1, mix.documents + 1, dtype=np.float64)
        self.doc_popularity = (1 / ranks) / (1 / ranks).sum()
        self.count = 0
        self.jobs = 0  # batch jobs so far, over every group: each job's instruction blocks are its own
        self.day_s = mix.day_s or mix.duration_s
        self.groups = self.make_groups()

    def make_groups(self) -> list[_Group]:
        """One flat group of every tenant, or with a day one group per model (module docstring)."""
        mix = self.mix
        if not mix.has_day:
            return [_Group(tuple(range(mix.tenants)))]
        n = max(1, len(mix.models))
        members = [tuple(k for k in range(mix.tenants) if k % n == m) for m in range(n)]
        weights = mix.model_shares or tuple(float(len(tenants)) for tenants in members)
        phases = mix.phases or tuple((m + 0.5) / n for m in range(n))
        total = float(sum(weights))
        return [_Group(members[m], weights[m] / total, float(phases[m])) for m in range(n)]

    def pick_tenant(self, group: _Group) -> int:
        return group.tenants[int(self.rng.integers(len(group.tenants)))]

    def level(self, t: float, group: _Group) -> float:
        """The group's daily curve at ``t``: ``1 + swing * cos(2 pi (t / day_s - phase))``."""
        if group.phase is None:
            return 1.0
        return 1.0 + self.mix.swing * math.cos(2 * math.pi * (t / self.day_s - group.phase))

    def peak(self, group: _Group) -> float:
        """The most ``level`` reaches: the rate the candidates of the thinning arrive at."""
        return 1.0 if group.phase is None else 1.0 + self.mix.swing

    def kept(self, t: float, group: _Group) -> bool:
        """Thinning: a candidate at ``t`` is kept with probability ``level(t) / peak``."""
        if group.phase is None:
            return True  # no draw: a mix without a day keeps its exact records
        return bool(self.rng.random() * self.peak(group) < self.level(t, group))

    def unique_ids(self, n: int) -> list[int]:
        ids = list(range(self.next_unique, self.next_unique + n))
        self.next_unique += n
        return ids

    def record(
        self, t_s: float, tenant: int, input_tokens: int, output: int, ids: list[int], kind: str, **extra: Any
    ) -> Record:
        self.count += 1
        blocks_needed = -(-input_tokens // BLOCK_TOKENS)
        ids = ids[:blocks_needed] + self.unique_ids(max(0, blocks_needed - len(ids)))
        return {
            "request_id": f"s{self.count:06d}",
            "timestamp": round(t_s * 1000),
            "input_length": input_tokens,
            "output_length": max(1, min(output, self.max_tokens[tenant])),
            "hash_ids": ids,
            "tenant": f"tenant-{tenant}",
            "max_tokens": self.max_tokens[tenant],
            "task_type": kind,
            **self.model_of(tenant),
            **extra,
        }

    def model_of(self, tenant: int) -> Record:
        """The ``model`` (and ``model_version``) fields of tenant ``tenant``'s requests."""
        if not self.mix.models:
            return {}
        name, _, version = self.mix.models[tenant % len(self.mix.models)].partition("@")
        return {"model": name, "model_version": version} if version else {"model": name}

    def arrivals(self, rate: float, group: _Group) -> Iterator[float]:
        """Arrivals of mean ``rate`` times the group's curve: MMPP candidates, thinned."""
        for t in self.mmpp(rate * self.peak(group)):
            if self.kept(t, group):
                yield t

    def mmpp(self, rate: float) -> Iterator[float]:
        """Markov-modulated Poisson arrivals with mean ``rate`` over the duration."""
        mix, rng = self.mix, self.rng
        if rate <= 0:
            return  # a kind or a model with no share has no arrivals
        calm = 2 * rate / (1 + mix.burst_factor)
        t, bursting = 0.0, False
        phase_end = rng.exponential(mix.mean_phase_s)
        while True:
            current = calm * (mix.burst_factor if bursting else 1.0)
            t += rng.exponential(1 / current)
            while t > phase_end:
                # Memoryless: restart the gap at the phase boundary with the new rate.
                t = phase_end
                bursting = not bursting
                phase_end = t + rng.exponential(mix.mean_phase_s)
                current = calm * (mix.burst_factor if bursting else 1.0)
                t += rng.exponential(1 / current)
            if t >= mix.duration_s:
                return
            yield t

    def interactive(self) -> Iterator[Record]:
        for group in self.groups:
            yield from self.group_interactive(group)

    def group_interactive(self, group: _Group) -> Iterator[Record]:
        mix, rng = self.mix, self.rng
        shares = np.array([mix.share_chat, mix.share_doc_qa, mix.share_api])
        shares = shares / shares.sum()
        rate = mix.rate_per_s * group.share
        mean_turns = 4.0
        # Chat sessions start less often than chat requests arrive: each has several turns.
        session_rate = rate * shares[0] / mean_turns
        for start in self.arrivals(session_rate, group):
            yield from self.chat_session(start, mean_turns, group)
        for t in self.arrivals(rate * shares[1], group):
            yield self.doc_question(t, group)
        for t in self.arrivals(rate * shares[2], group):
            tenant = self.pick_tenant(group)
            prompt = int(rng.integers(200, 3000))
            ids = [_SYSTEM_BASE + tenant * 100]  # one shared instruction block per tenant
            yield self.record(t, tenant, prompt + BLOCK_TOKENS, int(rng.lognormal(5.0, 0.7)), ids, "api")

    def chat_session(self, start: float, mean_turns: float, group: _Group) -> Iterator[Record]:
        mix, rng = self.mix, self.rng
        tenant = self.pick_tenant(group)
        system = [_SYSTEM_BASE + tenant * 100 + i for i in range(self.system_blocks[tenant])]
        history_tokens = len(system) * BLOCK_TOKENS
        history_ids = list(system)
        t = start
        for _ in range(1 + int(rng.poisson(mean_turns - 1))):
            if t >= mix.duration_s:
                return
            user = int(rng.integers(50, 1200))
            prompt = history_tokens + user
            output = int(rng.lognormal(5.3, 0.8))
            history_ids += self.unique_ids(prompt // BLOCK_TOKENS - len(history_ids))
            yield self.record(t, tenant, prompt, output, list(history_ids), "chat")
            # The next turn's prompt is this prompt plus the answer.
            history_tokens = prompt + min(output, self.max_tokens[tenant])
            t += float(rng.exponential(20.0)) + 2.0

    def doc_question(self, t: float, group: _Group) -> Record:
        rng = self.rng
        tenant = self.pick_tenant(group)
        doc = int(rng.choice(self.mix.documents, p=self.doc_popularity))
        tokens = self.doc_tokens[doc]
        ids = [_DOC_BASE + doc * 1000 + i for i in range(tokens // BLOCK_TOKENS)]
        question = int(rng.integers(30, 300))
        return self.record(t, tenant, tokens + question, int(rng.lognormal(4.8, 0.6)), ids, "doc_qa")

    def batch_jobs(self) -> Iterator[Record]:
        for group in self.groups:
            yield from self.group_batch_jobs(group)

    def group_batch_jobs(self, group: _Group) -> Iterator[Record]:
        mix, rng = self.mix, self.rng
        jobs_per_hour = mix.batch_jobs_per_hour * group.share * self.peak(group)
        t = 0.0
        while jobs_per_hour > 0:
            t += float(rng.exponential(3600.0 / jobs_per_hour))
            if t >= mix.duration_s:
                return
            if not self.kept(t, group):
                continue
            tenant = self.pick_tenant(group)
            size = int(rng.integers(*mix.batch_job_size))
            deadline = float(rng.choice([600.0, 1200.0, 1800.0]))
            instruction = [_JOB_BASE + self.jobs * 100 + i for i in range(int(rng.integers(1, 4)))]
            for _ in range(size):
                prompt = len(instruction) * BLOCK_TOKENS + int(rng.integers(500, 4000))
                yield self.record(
                    t,
                    tenant,
                    prompt,
                    int(rng.lognormal(5.5, 0.5)),
                    list(instruction),
                    "batch",
                    slo_class="batch",
                    deadline_s=deadline,
                )
            self.jobs += 1


def write_jsonl(records: list[Record], path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
    return len(records)
