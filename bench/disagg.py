"""Benchmark: prefill/decode disaggregation, chosen per request, against serving whole and the
peers' rules (``python -m bench.disagg``).

``python -m bench.disagg [--mixes long,mooncake,...] [--arrangements pd-2-6,...] [--jobs N]
[--json FILE]``

Eight llama3-8b H100 instances in one DC, arranged as:
- ``whole``: all ``both``, no KV link: every request served whole (the aggregated reference);
- ``both-link``: all ``both`` with a 400 Gb/s link: any instance may prefill for another;
- ``pd-P-D`` (``pd-2-6`` tuned on, ``pd-3-5``, ``pd-1-7`` held out): P prefill and D decode
  instances, 400 Gb/s; ``pd-2-6-slow``: the same at 100 Gb/s.

Per mix and arrangement, the SLO capacity (``sim/evaluation/capacity.py``: the highest rate
scale keeping 99 % of interactive requests within TTFT and TPOT) of ``tokenpilot`` and, on the
P/D arrangements, of ``llm-d-pd`` and ``dynamo-disagg``. The mixes (``MIXES``): ``long`` (a
third of the prompts over 16k tokens; tuned on seed 0, ``long-s1``, ``long-s2`` held out),
``mooncake`` (the Mooncake conversation trace, arrivals spread over their 3 s bins) and
``short`` (chat and API calls only), the last also at its recorded rate, where TokenPilot on
``both-link`` must keep >= 0.99 of its goodput served whole.

``--bound`` prints instead, per mix, FleetMind's fluid model of the split
(``agents/policy/fleetmind/split.py``) on the profile's own step law and the mix's mean prompt
and output (no prefix reuse): the requests/s one replica serves prefill only, decode only and
``both`` at the interactive objective, the replicas a split needs against all ``both``
(``ratio``: below 1 the split serves more on the same GPUs, its capacity at most 1 / ratio of
``both``'s), and the tightest TPOT objective down to which all ``both`` stays the better.

``--planned`` runs FleetMind's planner on the short mix at 15 requests/s with an interactive TPOT
objective of 40 ms (where its fluid model splits) on an 8-GPU DC: without a link (every replica
``both``), and with a 400 Gb/s link and ``split_gain`` 0.1 (it starts prefill-only replicas),
under ``tokenpilot`` and ``dynamo-disagg``: goodput, compliant share, replicas started by role,
KV transfers.

Printed: a table per mix, then the targets: on ``long`` and ``mooncake``, TokenPilot's
capacity on each P/D arrangement >= 1.3 x the better peer's there, and its best P/D capacity
>= 1.15 x ``whole``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from agents.policy.fleetmind.split import StepLaw, Work, split
from agents.policy.planners import build_planner
from sim.engine.fleet import FleetSpec, fleet_from_doc
from sim.engine.profiles import PROFILES
from sim.evaluation.capacity import capacities
from sim.evaluation.compare import compare
from sim.evaluation.metrics import judged, report
from sim.loop.config import SimConfig
from sim.loop.deciders import pool_decider_for
from sim.loop.runner import Simulation
from sim.workloads.sources import open_workload

MOONCAKE = Path(__file__).resolve().parents[1] / "sim" / "traces" / "mooncake" / "conversation_trace.jsonl"
LONG = "synthetic:duration_s=300,rate_per_s=10,share_doc_qa=0.45,share_chat=0.3,share_api=0.25"
MIXES = {
    "long": LONG,
    "long-s1": f"{LONG},seed=1",
    "long-s2": f"{LONG},seed=2",
    "mooncake": str(MOONCAKE),
    "short": "synthetic:duration_s=300,rate_per_s=10,share_doc_qa=0,share_chat=0.5,share_api=0.5",
}
JITTER_S = {"mooncake": 3.0}
ARRANGEMENTS = {  # name -> (prefill instances, decode instances, link Gb/s; 0: none)
    "whole": (0, 8, 0.0),
    "both-link": (0, 8, 400.0),
    "pd-2-6": (2, 6, 400.0),
    "pd-3-5": (3, 5, 400.0),
    "pd-1-7": (1, 7, 400.0),
    "pd-2-6-slow": (2, 6, 100.0),
}
PEERS = ("llm-d-pd", "dynamo-disagg")
PROFILE = "llama3-8b-h100"


def fleet(arrangement: str) -> FleetSpec:
    """The eight instances of ``arrangement`` (module docstring)."""
    prefill, decode, gbps = ARRANGEMENTS[arrangement]
    groups: list[dict[str, Any]] = []
    if prefill:
        groups.append({"count": prefill, "profile": PROFILE, "role": "prefill"})
    groups.append({"count": decode, "profile": PROFILE, "role": "decode" if prefill else "both"})
    dc: dict[str, Any] = {"name": "A", "instances": groups}
    if gbps:
        dc["kv_link_gbps"] = gbps
    return fleet_from_doc({"data_centres": [dc]}, Path(f"{arrangement}.yaml"))


def policies(arrangement: str) -> list[str]:
    return ["tokenpilot", *PEERS] if arrangement.startswith("pd-") else ["tokenpilot"]


def capacity_cell(mix: str, arrangement: str, jobs: int) -> dict[str, Any]:
    """``{policy: capacity document}`` of one mix on one arrangement."""
    config = SimConfig()
    workload = open_workload(MIXES[mix]).jittered(JITTER_S.get(mix, 0.0), config.seed)
    document = capacities(
        workload, fleet(arrangement), policies(arrangement), config, precision=0.04, jobs=jobs
    )
    found = document["capacity"]
    assert isinstance(found, dict)
    return found


def normal_load_goodput(mix: str) -> dict[str, float]:
    """Goodput (tokens/s) at the recorded rate: TokenPilot served whole and on ``both-link``."""
    config = SimConfig()
    workload = open_workload(MIXES[mix])
    out = {}
    for arrangement in ("whole", "both-link"):
        document, _ = compare(workload, fleet(arrangement), ["tokenpilot"], config)
        out[arrangement] = float(document["results"]["tokenpilot"]["goodput_tokens_per_s"])  # type: ignore[index]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixes", default="long,mooncake,short", help=f"of {', '.join(MIXES)}")
    parser.add_argument(
        "--arrangements", default=",".join(ARRANGEMENTS), help=f"of {', '.join(ARRANGEMENTS)}"
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--bound", action="store_true", help="the fluid model's split per mix, no runs")
    parser.add_argument("--planned", action="store_true", help="FleetMind's planned split (docstring)")
    args = parser.parse_args(argv)
    mixes = [m for m in args.mixes.split(",") if m]
    arrangements = [a for a in args.arrangements.split(",") if a]
    unknown = sorted({*mixes} - set(MIXES)) + sorted({*arrangements} - set(ARRANGEMENTS))
    if unknown:
        parser.exit(2, f"bench.disagg: unknown mix or arrangement {unknown[0]!r}\n")
    if args.bound:
        for mix in mixes:
            print(fluid_bound(mix))
        return
    if args.planned:
        print(planned_split())
        return
    results: dict[str, Any] = {}
    for mix in mixes:
        cells = {a: capacity_cell(mix, a, args.jobs) for a in arrangements}
        results[mix] = {"capacity": cells}
        print(table(mix, cells))
        if mix == "short":
            results[mix]["normal_load_goodput"] = goodput = normal_load_goodput(mix)
            ratio = goodput["both-link"] / goodput["whole"]
            print(f"short mix at its rate: goodput both-link / whole = {ratio:.3f} (target >= 0.99)")
        print(verdict(mix, cells))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
        print(f"wrote {args.json}")


def fluid_bound(mix: str, ttft_s: float = 2.0, tpot_s: float = 0.1) -> str:
    """The fluid model's split of ``mix`` on ``PROFILE`` (module docstring), one line."""
    profile = PROFILES[PROFILE]
    law = StepLaw(
        profile.t0_s,
        profile.decode_s_per_seq,
        profile.decode_s_per_context_token,
        profile.prefill_s_per_token,
        profile.prefill_s_per_token_pair,
    )
    requests = open_workload(MIXES[mix]).requests
    prompt = sum(r.input_tokens for r in requests) / len(requests)
    output = sum(r.output_tokens for r in requests) / len(requests)
    work = Work(prompt, 0.0, output, prompt + output)

    def at(tpot: float):  # type: ignore[no-untyped-def]
        return split(law, work, tpot, ttft_s, profile.kv_tokens, headroom=1.0, kv_share=1.0)

    found = at(tpot_s)
    ratio = found.ratio
    tight = tpot_s
    while tight > 0.005 and at(tight - 0.001).ratio >= 1:
        tight -= 0.001
    return (
        f"{mix}: prompt {prompt:.0f}, output {output:.0f} tokens; per replica (req/s) prefill only "
        f"{found.mu_prefill:.2f}, decode only {found.mu_decode:.2f}, both {found.mu_both:.2f}; "
        f"split / both replicas = {ratio:.2f} at TPOT {tpot_s * 1000:.0f} ms; "
        f"both stays the better down to TPOT {tight * 1000:.0f} ms"
    )


PLANNED_MIX = "synthetic:duration_s=600,rate_per_s=15,share_doc_qa=0,share_chat=0.5,share_api=0.5"
PLANNED_TPOT_S = 0.04


def planned_split() -> str:
    """FleetMind's planned split against none (module docstring), a table."""
    config = SimConfig()
    classes = dict(config.slo_classes)
    classes["interactive"] = replace(classes["interactive"], tpot_s=PLANNED_TPOT_S)
    config = replace(config, slo_classes=classes)
    workload = open_workload(PLANNED_MIX)
    lines = [
        f"FleetMind on the short mix, 15 req/s, TPOT objective {PLANNED_TPOT_S * 1000:.0f} ms, 8 GPUs",
        "| link, split | policy | goodput tok/s | compliant | started prefill / both | KV transfers |",
        "|---|---|---|---|---|---|",
    ]
    for gbps in (0.0, 400.0):
        dc: dict[str, Any] = {"name": "A", "gpus": 8, "instances": [{"count": 2, "profile": PROFILE}]}
        if gbps:
            dc["kv_link_gbps"] = gbps
        doc = {
            "data_centres": [dc],
            "models": {"llama3-8b": {"load_s": {"cold": 60, "warm": 20}, "min_replicas": 1}},
        }
        fleet_spec = fleet_from_doc(doc, Path("planned.yaml"))
        for policy in ("tokenpilot", "dynamo-disagg"):
            params = {"tokenpilot": {"tpot_s": PLANNED_TPOT_S}} if policy == "tokenpilot" else None
            planner = build_planner(
                "fleetmind", fleet_spec.rules, params={"split_gain": "0.1"} if gbps else None
            )
            run = Simulation(
                workload,
                fleet_spec,
                pool_decider_for(policy, fleet_spec, config, params),
                config,
                None,
                planner,
            )
            result = run.run()
            requests = judged(result.attempts, result.window, config.slo_classes)
            totals = report(result.attempts, result.window, config.slo_classes, result.busy_s, requests)
            started = [s.spec.role for s in run.shaper.replicas.slots if s.start is not None]
            cells = (
                "400 Gb/s, split" if gbps else "none",
                policy,
                f"{totals['goodput_tokens_per_s']:.0f}",
                f"{totals['compliant_share']:.3f}",
                f"{started.count('prefill')} / {started.count('both')}",
                str(result.kv_links["kv_transfers"]),
            )
            lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def scale(document: dict[str, Any]) -> float:
    return float(document["rate_scale"] or 0.0)


def table(mix: str, cells: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"\n{mix}: SLO capacity (rate scale)",
        "| arrangement | tokenpilot | llm-d-pd | dynamo-disagg |",
        "|---|---|---|---|",
    ]
    for arrangement, found in cells.items():
        row = [f"{scale(found[p]):.3f}" if p in found else "-" for p in ("tokenpilot", *PEERS)]
        lines.append(f"| {arrangement} | {' | '.join(row)} |")
    return "\n".join(lines)


def verdict(mix: str, cells: dict[str, dict[str, Any]]) -> str:
    """The targets' ratios on ``mix`` (module docstring)."""
    pd = {a: found for a, found in cells.items() if a.startswith("pd-")}
    parts = []
    for arrangement, found in pd.items():
        peer = max(scale(found[p]) for p in PEERS)
        ours = scale(found["tokenpilot"])
        parts.append(
            f"{arrangement}: tokenpilot / better peer = {ours / peer:.2f}"
            if peer
            else f"{arrangement}: peers 0"
        )
    if "whole" in cells and pd:
        best = max(pd, key=lambda a: scale(pd[a]["tokenpilot"]))
        whole = scale(cells["whole"]["tokenpilot"])
        parts.append(f"best P/D ({best}) / whole = {scale(pd[best]['tokenpilot']) / whole:.2f} (target 1.15)")
    if "both-link" in cells and "whole" in cells:
        ratio = scale(cells["both-link"]["tokenpilot"]) / scale(cells["whole"]["tokenpilot"])
        parts.append(f"both-link / whole = {ratio:.2f}")
    return f"{mix}: " + "; ".join(parts)


if __name__ == "__main__":
    main()
