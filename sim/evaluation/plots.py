"""Pictures of a result file (``tokenfleet report RESULT.json --out DIR``), as PNG.

What it draws depends on what the file holds:
- a ``simulate`` document (``results``): ``ttft_cdf.png`` (one TTFT CDF per policy, from
  ``ttft_quantiles_s``) and ``goodput_per_class.png`` (goodput per SLO class, bars per policy);
  and per run whose fleet a planner changed (``timeline``), ``replicas-RUN.png``: one panel per
  model, its replicas ready, loading and draining and the planner's target over time, summed
  over its DCs, next to the model's demand (arrivals per second);
- a ``capacity`` document: ``capacity.png`` (interactive requests within their objective
  against the rate scale, one line per policy through every probe the search made, the 99 %
  target and each policy's capacity marked);
- a scoreboard file (``runs``): the capacity picture of each (workload, engine) run;
- a goodput curve (``curve``, ``python -m bench.goodput_curve``): ``goodput_curve.png``, per
  workload goodput and compliant share against load (x L67), one line per policy.
Returns the files written. matplotlib runs headless (the Agg backend).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: files only, never a window

import matplotlib.pyplot as plt

from sim.evaluation.metrics import QUANTILES


class NotAResult(ValueError):
    """The file is not a simulate, capacity or scoreboard result."""


def draw(document: Mapping[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    if "capacity" in document:
        return [capacity_plot(document, out / "capacity.png")]
    if "curve" in document:
        return [curve_plot(document, out / "goodput_curve.png")]
    if "results" in document:
        return simulate_plots(document, out, "")
    if "runs" in document:
        written: list[Path] = []
        for run in document["runs"]:
            if "capacity" in run:
                name = f"{run['workload']}-{run.get('engine', 'default')}-capacity.png"
                written.append(capacity_plot(run, out / name))
            else:
                written += simulate_plots(run, out, f"{run['workload']}-x{run['rate_scale']}-")
        return written
    raise NotAResult(
        "not a simulate, capacity, scoreboard or curve result (no 'results', 'capacity', 'runs' or 'curve')"
    )


def simulate_plots(document: Mapping[str, Any], out: Path, prefix: str) -> list[Path]:
    title = f"{document['workload']} x{document['rate_scale']} on {document['fleet']}"
    policies = {name: r for name, r in document["results"].items() if r.get("ttft_quantiles_s")}
    written = []
    if policies:
        written.append(_ttft_cdf(policies, title, out / f"{prefix}ttft_cdf.png"))
    written.append(_goodput_per_class(document["results"], title, out / f"{prefix}goodput_per_class.png"))
    for name, result in document["results"].items():
        if result.get("replica_starts") and result.get("timeline"):
            slug = name.replace("@", "-at-").replace("+", "-").replace("/", "-")
            written.append(_replicas(name, result["timeline"], title, out / f"{prefix}replicas-{slug}.png"))
    return written


_STATES = (("ready", "tab:green"), ("loading", "tab:orange"), ("draining", "tab:red"))


def _replicas(name: str, timeline: Mapping[str, Any], title: str, path: Path) -> Path:
    """Replicas per model over time, by state, with the target and the demand."""
    minutes = [t / 60 for t in timeline["t_s"]]
    models = sorted({pool.split("@")[0] for pool in timeline["pools"]})
    figure, panels = plt.subplots(len(models), 1, figsize=(9, 2.6 * len(models) + 0.8), squeeze=False)
    for axes, model in zip(panels[:, 0], models, strict=True):
        pools = [v for pool, v in timeline["pools"].items() if pool.split("@")[0] == model]

        def total(key: str, pools: list[Mapping[str, Any]] = pools) -> list[int]:
            return [sum(p[key][k] for p in pools) for k in range(len(minutes))]

        axes.stackplot(minutes, *(total(key) for key, _ in _STATES), labels=[k for k, _ in _STATES],
                       colors=[c for _, c in _STATES], alpha=0.6, step="post")  # fmt: skip
        axes.step(minutes, total("desired"), where="post", color="black", linewidth=1, label="target")
        axes.set_ylabel(f"{model}\nreplicas")
        demand = timeline.get("demand_per_s", {}).get(model)
        if demand:
            twin = axes.twinx()
            twin.plot(minutes[: len(demand)], demand, color="tab:blue", linewidth=0.8, label="demand")
            twin.set_ylabel("arrivals/s", color="tab:blue")
        axes.grid(True, alpha=0.3)
    panels[0, 0].legend(fontsize=7, loc="upper left", ncol=4)
    panels[-1, 0].set_xlabel("minutes")
    _title(panels[0, 0], f"Replicas per model — {name} — {title}")
    return _save(figure, path)


def _ttft_cdf(results: Mapping[str, Mapping[str, Any]], title: str, path: Path) -> Path:
    figure, axes = plt.subplots(figsize=(8, 5))
    for name, result in results.items():
        points = [(v, q / 100) for v, q in zip(result["ttft_quantiles_s"], QUANTILES, strict=True) if v]
        if points:
            xs, ys = zip(*points, strict=True)
            axes.step(xs, ys, where="post", label=name)
    axes.set_xscale("log")
    axes.set_xlabel("TTFT (s, log scale)")
    axes.set_ylabel("share of requests")
    axes.set_ylim(0, 1)
    axes.grid(True, which="both", alpha=0.3)
    _title(axes, f"TTFT CDF — {title}", "(a curve ends below 1 where requests never got a first token)")
    axes.legend(fontsize=8)
    return _save(figure, path)


def _goodput_per_class(results: Mapping[str, Mapping[str, Any]], title: str, path: Path) -> Path:
    classes = sorted({c for r in results.values() for c in r.get("per_class", {})})
    names = list(results)
    figure, axes = plt.subplots(figsize=(max(6, 1.2 * len(names) * max(len(classes), 1)), 5))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        values = [
            results[name].get("per_class", {}).get(c, {}).get("goodput_tokens_per_s", 0) for c in classes
        ]
        axes.bar([k + i * width for k in range(len(classes))], values, width, label=name)
    axes.set_xticks([k + width * (len(names) - 1) / 2 for k in range(len(classes))], classes)
    axes.set_ylabel("goodput (output tokens/s meeting the class's SLO)")
    _title(axes, f"Goodput per SLO class — {title}")
    axes.legend(fontsize=8)
    return _save(figure, path)


def capacity_plot(document: Mapping[str, Any], path: Path) -> Path:
    figure, axes = plt.subplots(figsize=(8, 5))
    target = document["target_interactive_slo_share"]
    for name, found in document["capacity"].items():
        probes: Sequence[Mapping[str, float]] = sorted(found["probes"], key=lambda p: p["rate_scale"])
        line = axes.plot(
            [p["rate_scale"] for p in probes],
            [p["interactive_slo_share"] for p in probes],
            marker="o",
            markersize=3,
            label=f"{name} (capacity x{found['rate_scale']})" if found["rate_scale"] else f"{name} (none)",
        )
        if found["rate_scale"]:
            axes.axvline(found["rate_scale"], color=line[0].get_color(), alpha=0.3, linestyle=":")
    axes.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:.0%}")
    axes.set_xscale("log")
    axes.set_xlabel("arrival-rate scale (x the trace's rate, log scale)")
    axes.set_ylabel("interactive requests within TTFT and TPOT")
    engine = f", {document['engine']} engine" if "engine" in document else ""
    _title(axes, f"SLO capacity — {document['workload']} on {document['fleet']}{engine}")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    return _save(figure, path)


def curve_plot(document: Mapping[str, Any], path: Path) -> Path:
    """One row per workload: goodput (left) and compliant share (right) against load."""
    curve: Mapping[str, Mapping[str, Any]] = document["curve"]
    figure, grid = plt.subplots(len(curve), 2, figsize=(11, 3.6 * len(curve)), squeeze=False)
    for (name, entry), (goodput, compliant) in zip(curve.items(), grid, strict=True):
        points: Sequence[Mapping[str, Any]] = sorted(entry["points"], key=lambda p: p["load"])
        loads = [p["load"] for p in points]
        policies = [n for n in points[0]["policies"] if all(n in p["policies"] for p in points)]
        for policy in policies:
            figures = [p["policies"][policy] for p in points]
            style = {"marker": "o", "markersize": 3, "label": policy}
            goodput.plot(loads, [f["goodput_tokens_per_s"] for f in figures], **style)
            compliant.plot(loads, [f["compliant_share"] for f in figures], **style)
        for axes, label in ((goodput, "goodput (tokens/s)"), (compliant, "compliant share")):
            axes.axvline(1.0, color="black", linestyle=":", linewidth=1)
            axes.set_xlabel(f"load (x L67 = rate scale {entry['l67']:g})")
            axes.set_ylabel(label)
            axes.set_title(f"{name}: {label}")
            axes.grid(True, alpha=0.3)
        compliant.set_ylim(0, 1.02)
        goodput.legend(fontsize=8)
    return _save(figure, path)


_TITLE_CHARS_PER_INCH = 10.0
"""Characters of a title (12 pt) per inch of figure width, with room to spare: the wrap width."""


def _title(axes: Any, *lines: str) -> None:
    """``lines`` as the axes' title, each wrapped to the figure's width (a workload's name can be
    a long path or spec; ``tight_layout`` makes room above for a tall title, not a wide one)."""
    width = max(int(axes.figure.get_figwidth() * _TITLE_CHARS_PER_INCH), 20)
    axes.set_title("\n".join(textwrap.fill(line, width, break_on_hyphens=False) for line in lines))


def _save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
