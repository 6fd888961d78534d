"""SLOMax's ``GoodputSource`` on ClickHouse, and where its control steps are written.

``ClickHouseGoodput.window(now_s, span_s)`` reads the feedback tables (``completions``, and the
rejects in ``admission_decisions``) for ``ts`` in ``(now_s - span_s, now_s]`` and counts per
``slo_class`` exactly as ``agents.policy.slomax.feedback.InMemoryGoodput`` does (see its
docstring): ``met`` is the ``met_slo`` column the sink judged at insert time. ``FINAL`` reads each
event once however often it was delivered (ReplacingMergeTree on ``event_id``). Times are the
driver's clock as epoch seconds (wall time in the service; the simulator writes its own clock).

``ClickHouseOutcomes`` is the simulator's ``OutcomeSink`` on ClickHouse: it writes each ended
attempt as its ``Completion`` (``sim.loop.feedback.EndedAttempt.completion``: this adapter takes
any attempt that gives one and imports nothing of the simulator) and each reject as an
``AdmissionDecision`` through the production sink (which judges ``met_slo`` itself), and its
``window`` flushes them and reads them back with the query above: the simulated control loop
reads what the production one reads.

``StoreGoodput`` is the streaming worker's source: it runs those reads and writes on the feedback
store's own thread (``ClickHouseFeedback.submit``), so routing never waits on ClickHouse.

``record(step)`` appends the control step to ``slomax_adjustments`` (what was read, what moved,
why). Both are called from the control loop's thread: the service runs them off the event loop,
and a failing store makes the loop hold its state (``Controller`` treats no data as stale).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Protocol

from clickhouse_connect.driver.client import Client

from agents.policy.common.slo import SloClass
from agents.policy.slomax.controller import Step
from agents.policy.slomax.feedback import ClassWindow
from infra.clickhouse.feedback import ClickHouseFeedback
from infra.clickhouse.sink import FeedbackSink, ms_time
from schemas.events import AdmissionDecision, Completion

log = logging.getLogger(__name__)


_RANGE = (
    "ts > fromUnixTimestamp64Milli({lo:Int64}, 'UTC') AND ts <= fromUnixTimestamp64Milli({hi:Int64}, 'UTC')"
)

_RUN = "({run:String} = '' OR run_id = {run:String})"
_POOL = "({pool:String} = '' OR model = {pool:String})"

_COMPLETIONS_SQL = f"""
SELECT
    slo_class,
    count(),
    sum(met_slo),
    sum(output_tokens),
    sum(output_tokens * met_slo),
    countIf(status = 'timeout'),
    countIf(status = 'aborted'),
    countIf(attempt > 1),
    max(toUnixTimestamp64Milli(ts)) / 1000
FROM completions FINAL
WHERE {_RANGE} AND {_RUN} AND {_POOL}
GROUP BY slo_class
"""

_REJECTS_SQL = f"""
SELECT slo_class, count(), max(toUnixTimestamp64Milli(ts)) / 1000
FROM admission_decisions FINAL
WHERE {_RANGE} AND {_RUN} AND {_POOL} AND action = 'reject'
GROUP BY slo_class
"""

ADJUSTMENT_COLUMNS = (
    "ts", "policy", "action", "reason", "interactive_met_share", "batch_misses", "headroom_before",
    "headroom_after", "batch_share_before", "batch_share_after",
)  # fmt: skip


class ClickHouseGoodput:
    """Windows of the rows of run ``run_id`` (every run: "") and model pool ``pool`` (every
    pool: ""): one pool's control loop reads its own pool's outcomes."""

    def __init__(self, client: Client, policy: str = "slomax", run_id: str = "", pool: str = "") -> None:
        self._client = client
        self.policy = policy
        self.run_id = run_id
        self.pool = pool

    def window(self, now_s: float, span_s: float) -> dict[str, ClassWindow]:
        bounds = {
            "lo": int((now_s - span_s) * 1000),
            "hi": int(now_s * 1000),
            "run": self.run_id,
            "pool": self.pool,
        }
        counts: dict[str, dict[str, float]] = {}
        for name, finished, met, out, good, timeouts, aborted, retries, newest in self._client.query(
            _COMPLETIONS_SQL, parameters=bounds
        ).result_rows:
            counts[name] = {
                "finished": finished, "met": met, "output_tokens": out, "good_tokens": good,
                "timeouts": timeouts, "aborted": aborted, "retries": retries, "rejected": 0,
                "newest_s": newest,
            }  # fmt: skip
        for name, rejected, newest in self._client.query(_REJECTS_SQL, parameters=bounds).result_rows:
            entry = counts.setdefault(name, {"newest_s": newest})
            entry["rejected"] = rejected
            entry["newest_s"] = max(entry["newest_s"], newest)
        return {
            name: ClassWindow(
                name,
                **{k: int(v) for k, v in c.items() if k != "newest_s"},
                newest_s=float(c["newest_s"]),
            )
            for name, c in counts.items()
        }

    def record(self, step: Step) -> None:
        """Append ``step`` to ``slomax_adjustments``."""
        row = [
            ms_time(step.time_s), self.policy, step.action, step.reason,
            step.interactive_met_share, step.batch_misses, step.before.headroom, step.after.headroom,
            step.before.batch_share, step.after.batch_share,
        ]  # fmt: skip
        self._client.insert("slomax_adjustments", [row], column_names=list(ADJUSTMENT_COLUMNS))


class EndedAttempt(Protocol):
    """An attempt that ended on an instance, as the simulator reports it."""

    def completion(self) -> Completion: ...


class ClickHouseOutcomes:
    """The simulator's outcomes written to ClickHouse and read back (see the module docstring)."""

    def __init__(self, client: Client, slo_classes: Mapping[str, SloClass], policy: str = "slomax") -> None:
        self.sink = FeedbackSink(client, slo_classes)
        self.source = ClickHouseGoodput(client, policy)
        self.policy = policy
        self._completions: list[Completion] = []
        self._rejects: list[AdmissionDecision] = []
        self._count = 0

    def ended(self, attempt: EndedAttempt) -> None:
        self._completions.append(attempt.completion())

    def rejected(self, time_s: float, slo_class: str) -> None:
        self._count += 1
        self._rejects.append(
            AdmissionDecision(
                ts=time_s, request_id=f"sim-reject-{self._count}", model="sim", slo_class=slo_class,
                action="reject", reason="simulated reject", policy=self.policy,
            )
        )  # fmt: skip

    def window(self, now_s: float, span_s: float) -> dict[str, ClassWindow]:
        self.flush()
        return self.source.window(now_s, span_s)

    def flush(self) -> None:
        """Write what was recorded since the last window (the end of a run)."""
        if self._completions:
            self.sink.write_completions(self._completions)
            self._completions = []
        if self._rejects:
            self.sink.write_admission(self._rejects)
            self._rejects = []


class StoreGoodput:
    """SLOMax's ``GoodputSource`` in the service, never blocking the caller.

    ``window(now_s, span_s)`` returns the windows of the latest read that finished and asks the
    store thread for a fresh one (one read in flight at a time): the loop steps on feedback one
    control interval old. The first call returns nothing (the controller holds: stale). While
    the store is down no read is queued and the last windows age until the controller holds.
    ``record(step)`` queues the step's row the same way (dropped, and logged, if the store is down).
    """

    def __init__(self, store: ClickHouseFeedback, policy: str, run_id: str = "", pool: str = "") -> None:
        self._store = store
        self.policy = policy
        self.run_id = run_id
        self.pool = pool
        self._lock = threading.Lock()
        self._latest: dict[str, ClassWindow] = {}
        self._reading = False

    def window(self, now_s: float, span_s: float) -> dict[str, ClassWindow]:
        with self._lock:
            latest, reading = self._latest, self._reading
            self._reading = True
        if not reading:

            def read(client: Client) -> dict[str, ClassWindow]:
                return ClickHouseGoodput(client, self.policy, self.run_id, self.pool).window(now_s, span_s)

            if not self._store.submit(read, self._read):
                with self._lock:
                    self._reading = False
        return latest

    def _read(self, windows: dict[str, ClassWindow] | None, error: BaseException | None) -> None:
        with self._lock:
            self._reading = False
            if error is None and windows is not None:
                self._latest = windows
        if error is not None:
            log.warning("slomax: reading goodput from ClickHouse failed (%s); the loop holds", error)

    def record(self, step: Step) -> None:
        def write(client: Client) -> None:
            ClickHouseGoodput(client, self.policy).record(step)

        if not self._store.submit(write, self._written):
            log.info("slomax: the feedback store is down; control step at %.0f not recorded", step.time_s)

    @staticmethod
    def _written(_: object, error: BaseException | None) -> None:
        if error is not None:
            log.warning("slomax: writing a control step to ClickHouse failed (%s)", error)
