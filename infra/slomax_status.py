"""What ``tokenfleet slomax status`` prints: SLOMax's configuration, its control loop's last steps
(``slomax_adjustments``) and the recent rejects by reason (``admission_decisions``)."""

from __future__ import annotations

import inspect
import time

from clickhouse_connect.driver.client import Client

from agents.policy.registry import parse_policy
from agents.policy.slomax import SloMax
from infra.settings import Settings

REJECT_WINDOW_S = 300.0

_STEPS_SQL = """
SELECT ts, policy, action, reason, interactive_met_share, headroom_before, headroom_after,
       batch_share_before, batch_share_after
FROM slomax_adjustments
ORDER BY ts DESC
LIMIT {n:UInt32}
"""

_REJECTS_SQL = """
SELECT slo_class, splitByChar(':', reason)[1] AS code, count()
FROM admission_decisions FINAL
WHERE action = 'reject' AND ts > now64(3) - toIntervalSecond({window:UInt32})
GROUP BY slo_class, code
ORDER BY slo_class, code
"""

_SHOWN = (
    "headroom", "long_headroom", "batch_share", "saturation", "long_prefills_per_instance",
    "deadline_margin_s", "tpot_estimate_s", "tenant_quota_tokens", "control_interval_s", "control_span_s",
)  # fmt: skip


def status_lines(client: Client, settings: Settings, steps: int) -> list[str]:
    admission = parse_policy(settings.policy)[0]
    lines = [f"policy {settings.policy} (admission: {admission})"]
    if admission == "slomax":
        configured = settings.policy_params.get("slomax", {})
        defaults = {
            name: p.default for name, p in inspect.signature(SloMax).parameters.items() if name in _SHOWN
        }
        values = {**defaults, **{k: v for k, v in configured.items() if k in _SHOWN}}
        lines.append("configured: " + ", ".join(f"{k}={values[k]}" for k in _SHOWN))
        for key in ("tenant_tiers", "tenant_classes", "tenant_weights"):
            if configured.get(key):
                lines.append(f"{key}: {configured[key]}")
    else:
        lines.append("the configured policy has no SLOMax stage; steps below are from earlier runs")
    recorded = client.query(_STEPS_SQL, parameters={"n": steps}).result_rows
    if not recorded:
        lines.append("control steps: none recorded yet")
    else:
        last = recorded[0]
        lines.append(
            f"in force ({last[1]}, since {last[0]:%Y-%m-%d %H:%M:%S} UTC): headroom {last[6]:.3f}, "
            f"batch_share {last[8]:.3f}"
        )
        lines.append(f"last {len(recorded)} control steps, newest first:")
        for ts, _policy, action, reason, met, h0, h1, b0, b1 in recorded:
            shown = "-" if met is None else f"{met:.3f}"
            lines.append(
                f"  {ts:%H:%M:%S} {action:<14} met {shown:<6} headroom {h0:.3f}->{h1:.3f} "
                f"batch_share {b0:.3f}->{b1:.3f}  {reason}"
            )
    rejects = client.query(_REJECTS_SQL, parameters={"window": int(REJECT_WINDOW_S)}).result_rows
    since = time.strftime("%H:%M:%S", time.gmtime(time.time() - REJECT_WINDOW_S))
    if rejects:
        lines.append(f"rejects since {since} UTC: " + ", ".join(f"{c}/{code} {n}" for c, code, n in rejects))
    else:
        lines.append(f"rejects since {since} UTC: none")
    return lines
