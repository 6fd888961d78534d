"""A worker's decisions, handed from one of its processes to the next through its data directory.

The request lane knows what was decided before from the log (``tf.admission``, ``tf.decisions``).
When the broker lost that log (a restarted embedded broker keeps it in memory), the worker's
process gives up and the supervisor starts a new one (``worker/watchdog.py``): the log no longer
says what the old process decided, and a client that resends a request whose answer was lost
with the log would get a second decision. So the process that gives up writes the decisions it
keeps (``RoutingService.answers``) to ``<data dir>/decided.jsonl`` and the next one reads those
of the last ``max_age_s`` back (``RoutingService.restore``): a resend gets the same decision.

One JSON line per decision: ``{"admission": AdmissionDecision | null, "routing": RoutingDecision
without its request | null}``. A file that cannot be read is logged and ignored (the worker
starts; only that memory is lost).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents.routing import Answer, RoutingService
from infra.files import write_atomic
from schemas.events import AdmissionDecision, InferenceRequest, RoutingDecision

log = logging.getLogger(__name__)

FILE_NAME = "decided.jsonl"
MAX_AGE_S = 900.0


def restore(service: RoutingService, path: Path) -> int:
    """Hand ``service`` the decisions its previous process kept at ``path`` (``load``); returns
    how many (and says so in one log line when there were any)."""
    restored = service.restore(load(path))
    if restored:
        log.warning("worker: %d decisions of its previous process restored from %s", restored, path)
    return restored


def keep(service: RoutingService, path: Path) -> None:
    """Write what ``service`` decided to ``path``, for the next process (``save``)."""
    save(path, service.answers())


def save(path: Path, answers: Sequence[Answer]) -> None:
    """Write ``answers`` to ``path`` (atomically: a reader sees the old file or the new one)."""
    lines = []
    for answer in answers:
        routing = None
        if answer.routing is not None:
            routing = answer.routing.model_dump(mode="json", exclude={"request"})
        admission = None if answer.admission is None else answer.admission.model_dump(mode="json")
        lines.append(json.dumps({"admission": admission, "routing": routing}))
    write_atomic(path, "".join(line + "\n" for line in lines))


def load(path: Path, max_age_s: float = MAX_AGE_S) -> list[Answer]:
    """The decisions in ``path`` made in the last ``max_age_s``; none if it does not exist."""
    if not path.exists():
        return []
    since = time.time() - max_age_s
    answers = []
    try:
        for line in path.read_text().splitlines():
            data = json.loads(line)
            admission = _admission(data.get("admission"))
            routing = _routing(data.get("routing"))
            decision = routing or admission
            if decision is not None and decision.ts >= since:
                answers.append(Answer(admission, routing))
    except (OSError, ValueError) as exc:
        log.warning("the decisions of the previous process (%s) cannot be read: %s", path, exc)
        return []
    return answers


def _admission(fields: dict[str, Any] | None) -> AdmissionDecision | None:
    return None if fields is None else AdmissionDecision.model_validate(fields)


def _routing(fields: dict[str, Any] | None) -> RoutingDecision | None:
    """The routing, validated with a stand-in request, kept without one (as ``Answer.keep``)."""
    if fields is None:
        return None
    stand_in = InferenceRequest(
        request_id=fields["request_id"], model=fields["model"], input_tokens=1, output_budget=1
    )
    routing = RoutingDecision.model_validate({**fields, "request": stand_in})
    return routing.model_copy(update={"request": None})
