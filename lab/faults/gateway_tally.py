"""The gateway scenarios' pure counting at the client: failed calls, answers delivered twice,
stretches without answers, when answers resumed, and how long ``/ready`` or ``tokenfleet
status`` said otherwise (definitions: ``lab.faults``). No network, no process: unit-tested.

Times are ``time.time()`` seconds. A call is one ``create()`` of the ``openai`` client under one
``x-request-id``; it makes one HTTP *attempt* per try (the client's own retries included), and
an attempt *waits* from the moment its request leaves until its response's headers arrive or it
fails (connection refused or reset, time-out). An attempt answered 200 is an *answer start*: for
a streamed call the gateway sends its headers with the first token, for a whole answer with the
answer; either way a decision was had and an engine answered.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from sim.evaluation.metrics import percentile

BLIND_AFTER_S = 2.0
"""A stretch this long in which calls waited and none got an answer start is *blind*: the
stack could not answer then. Far above a healthy answer start (a decision and a first token:
tens of milliseconds on emulated engines, ~1 s on vLLM CPU) and below any outage worth
counting."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One HTTP attempt of a call: when it left, when it ended, its status (``None``: no
    response: refused, reset, timed out) and, without a response, the error's class name."""

    sent: float
    done: float
    status: int | None
    error: str = ""


@dataclass(slots=True)
class Call:
    """One call as its client saw it. ``outcome``: ``ok`` (answered whole), ``failed`` (the
    client raised: ``error`` says what) or ``""`` (still running when the run ended).
    ``answer_ids``: the ids the answer carried (a streamed answer: each distinct chunk id)."""

    call_id: str
    streamed: bool
    started: float
    ended: float | None = None
    outcome: str = ""
    error: str = ""
    answer_ids: list[str] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)


def failed(calls: Iterable[Call]) -> int:
    """Calls whose client raised (after its own retries)."""
    return sum(1 for c in calls if c.outcome == "failed")


def failed_mid_answer(calls: Iterable[Call]) -> int:
    """Streamed calls that failed after part of their answer reached the client (its engine died
    while it answered: what the client already has cannot be taken back, so the gateway ends
    the stream with an error event instead of running the call again)."""
    return sum(1 for c in calls if c.outcome == "failed" and c.streamed and c.answer_ids)


def unended(calls: Iterable[Call]) -> int:
    """Calls neither answered nor failed by the end of the run (their client still waited)."""
    return sum(1 for c in calls if not c.outcome)


def failed_by(calls: Iterable[Call]) -> dict[str, int]:
    """Failed calls by what the client raised (``APIConnectionError``, ``InternalServerError
    503``, ...), most frequent first."""
    return dict(Counter(c.error for c in calls if c.outcome == "failed").most_common())


def answered_twice(calls: Iterable[Call]) -> int:
    """Call ids the client received more than one answer for: more than one attempt answered
    200 (whichever ``Call`` records carry the id: a user's resend under the same id counts)."""
    answers: Counter[str] = Counter()
    for c in calls:
        answers[c.call_id] += sum(1 for a in c.attempts if a.status == 200)
    return sum(1 for n in answers.values() if n > 1)


def answered_under_other_id(calls: Iterable[Call]) -> int:
    """Answered calls whose answer does not carry their own id (``chatcmpl-<id>`` /
    ``cmpl-<id>``): the gateway answered them under another id."""
    return sum(
        1
        for c in calls
        if c.outcome == "ok" and any(i.split("-", 1)[-1] != c.call_id for i in c.answer_ids or ["?"])
    )


def retries(calls: Iterable[Call]) -> tuple[int, dict[str, int]]:
    """HTTP attempts beyond each call's first (the client's own retries), and what the attempts
    that were retried got (a status, or the error's class name)."""
    count, why = 0, Counter[str]()
    for c in calls:
        count += max(0, len(c.attempts) - 1)
        for a in c.attempts[:-1]:
            why[str(a.status) if a.status is not None else a.error or "no response"] += 1
    return count, dict(why.most_common())


def answer_starts(calls: Iterable[Call]) -> list[float]:
    """When each attempt answered 200 arrived, sorted."""
    return sorted(a.done for c in calls for a in c.attempts if a.status == 200)


def blind_stretches(
    calls: Sequence[Call], until: float, blind_after_s: float = BLIND_AFTER_S
) -> list[tuple[float, float]]:
    """The stretches, sorted, in which calls waited without a break and no answer start came, at
    least ``blind_after_s`` long. A call waits from its start to its first answer start, or to
    its failure (``until`` if it never ended): its client's back-off between attempts is
    waiting too (a client told to come back later is not answered)."""
    waits: list[tuple[float, float]] = []
    for c in calls:
        answered = [a.done for a in c.attempts if a.status == 200]
        end = answered[0] if answered else (c.ended if c.ended is not None else until)
        if end > c.started:
            waits.append((c.started, end))
    starts = answer_starts(calls)
    merged: list[list[float]] = []
    for lo, hi in sorted(waits):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    # A stretch is blind only between two answer starts: cut the waiting at each of them.
    out: list[tuple[float, float]] = []
    for lo, hi in merged:
        edges = [lo, *(t for t in starts if lo < t < hi), hi]
        out += [(a, b) for a, b in pairwise(edges) if b - a >= blind_after_s]
    return out


def overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Seconds two intervals share."""
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def blind_since(blind: Sequence[tuple[float, float]], since: float) -> tuple[float, float]:
    """(total, longest) seconds of the blind stretches after ``since`` (the fault's start)."""
    parts = [overlap(s, (since, max(since, s[1]))) for s in blind]
    return sum(parts, 0.0), max(parts, default=0.0)


def resumed_after(blind: Sequence[tuple[float, float]], fault_start: float, back_at: float) -> float:
    """Seconds from ``back_at`` (the faulted part back) to the end of the last blind stretch
    that began after ``fault_start`` - 5 s: 0 when answers were flowing by then."""
    ends = [hi for lo, hi in blind if hi > fault_start and lo >= fault_start - 5.0]
    return max(0.0, max(ends, default=back_at) - back_at)


@dataclass(frozen=True, slots=True)
class Sample:
    """What a probe said at ``at``: ``ok`` True (ready), False (not ready, or no answer)."""

    at: float
    ok: bool


def lies(
    samples: Sequence[Sample], blind: Sequence[tuple[float, float]], span: tuple[float, float]
) -> tuple[float, float]:
    """(ready while blind, not ready while answering): seconds within ``span`` (the traffic's)
    in which the probe's last answer said the opposite of what the calls saw. A sample holds
    until the next one (the last until the span's end)."""
    ordered = sorted(samples, key=lambda s: s.at)
    ready_blind = unready_answering = 0.0
    ends = [s.at for s in ordered[1:]] + [span[1]] if ordered else []
    for sample, end in zip(ordered, ends, strict=True):
        held = (max(sample.at, span[0]), min(span[1], end))
        if held[1] <= held[0]:
            continue
        blind_s = sum(overlap(held, s) for s in blind)
        if sample.ok:
            ready_blind += blind_s
        else:
            unready_answering += (held[1] - held[0]) - blind_s
    return ready_blind, unready_answering


def wait_p99(calls: Iterable[Call], start: float, end: float) -> float | None:
    """p99 (nearest rank) of answer-start latency (an answered call's first attempt sent ->
    its answer start, retries included) over the calls started in [start, end]."""
    took = [
        next(a.done for a in c.attempts if a.status == 200) - c.started
        for c in calls
        if start <= c.started <= end and any(a.status == 200 for a in c.attempts)
    ]
    return percentile(took, 99.0)


def engine_calls(engine_ids: Iterable[str], call_ids: Iterable[str]) -> dict[str, str]:
    """Which call each engine request id names: the call's id itself, or the call's id followed
    by a separator (``-``, ``:``, ``.``, ``/``, ``#``) and more (the gateway sends
    ``<id>-<attempt>``); ids naming no call are left out."""
    ids = set(call_ids)
    out: dict[str, str] = {}
    for engine_id in engine_ids:
        if engine_id in ids:
            out[engine_id] = engine_id
            continue
        for cut in range(len(engine_id) - 1, 0, -1):
            if engine_id[cut] in "-:./#" and engine_id[:cut] in ids:
                out[engine_id] = engine_id[:cut]
                break
    return out


def started_twice(served: Mapping[str, int], calls: Mapping[str, str], placed: Mapping[str, int]) -> int:
    """Calls an engine ran an attempt of twice: an engine request id of theirs (``calls``: engine
    id -> call id) started more than once (summed over engines and their processes), or more
    starts than attempts of theirs were placed (for ids that carry no attempt). An attempt
    re-placed after its engine died is a placement of its own, under an id of its own."""
    starts: Counter[str] = Counter()
    twice = set()
    for engine_id, call_id in calls.items():
        starts[call_id] += served.get(engine_id, 0)
        if engine_id != call_id and served.get(engine_id, 0) > 1:  # one attempt's id, twice
            twice.add(call_id)
    twice |= {call_id for call_id, n in starts.items() if n > placed.get(call_id, 0)}
    return len(twice)


def held_at(calls: Iterable[Call], at: float) -> set[str]:
    """The calls with an attempt waiting or an answer in progress at ``at`` (a gateway killed
    then held them)."""
    return {
        c.call_id
        for c in calls
        if c.started <= at and (c.ended is None or c.ended > at) and any(a.sent <= at for a in c.attempts)
    }
