"""What ``tokenfleet replay`` prints (``cli/replay_run.py`` makes the document): the run, each
policy's replayed figures beside the observed ones, the spread of the draws, and the self error."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

SELF_ERROR = {
    "goodput": "goodput_tokens_per_s",
    "ttft_p50": "ttft_p50_s",
    "ttft_p95": "ttft_p95_s",
    "compliant_share": "compliant_share",
}
"""The ``self_error`` keys and the result figure each compares."""


def relative_error(predicted: object, observed: object) -> float | None:
    """(predicted - observed) / observed, rounded to 4 decimals; None if either is not a number
    or observed is 0."""
    numbers = [isinstance(v, int | float) and not isinstance(v, bool) for v in (predicted, observed)]
    if not all(numbers) or observed == 0:
        return None
    assert isinstance(predicted, int | float) and isinstance(observed, int | float)
    return round((predicted - observed) / observed, 4)


def self_error(predicted: Mapping[str, Any], observed: Mapping[str, Any]) -> dict[str, float | None]:
    """Each ``SELF_ERROR`` figure's relative error, a result (``predicted``) against the store's."""
    return {key: relative_error(predicted.get(name), observed.get(name)) for key, name in SELF_ERROR.items()}


DRAWN = (*SELF_ERROR.values(), "cost_per_million_goodput_tokens")
"""The figures whose spread over the draws a replay reports."""


def draw_figures(draws: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per policy, each ``DRAWN`` figure over the draws (each draw: the results of one seed):
    its ``median``, ``min`` and ``max`` (None when a draw lacks it)."""
    out: dict[str, dict[str, Any]] = {}
    for policy in draws[0]:
        out[policy] = {}
        for name in DRAWN:
            values = [draw[policy].get(name) for draw in draws]
            numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
            if len(numbers) < len(values):
                out[policy][name] = None
                continue
            out[policy][name] = {
                "median": statistics.median(numbers),
                "min": min(numbers),
                "max": max(numbers),
            }
    return out


def predicted(document: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """What a replay document predicts per policy: its ``results``, each figure drawn several
    times (``draws``) replaced by its median over the draws."""
    results: dict[str, dict[str, Any]] = document["results"]
    draws = document.get("draws")
    if draws is None:
        return results
    return {
        policy: {
            **result,
            **{name: s["median"] for name, s in draws["figures"][policy].items() if s is not None},
        }
        for policy, result in results.items()
    }


def header(document: Mapping[str, Any], instances: int) -> list[str]:
    """The run: its requests, those without hashes or left out, its instances, its policy."""
    counts = document["workload"]
    left_out = f", {counts['left_out']} left out (prompt size unknown)" if counts["left_out"] else ""
    return [
        f"run {document['run']}: {counts['requests']} requests ({counts['without_hashes']} without block "
        f"hashes: replayed without prefix reuse{left_out}), {instances} instances; the policy that ran: "
        f"{document['policy_ran'] or 'unknown'}"
    ]


def replay_lines(document: Mapping[str, Any], ran_key: str | None) -> list[str]:
    """Per policy: goodput, compliant share (all, per class), TTFT p50 / p95 and cost per million
    compliant tokens; then the policy that ran, predicted beside observed with the error."""
    results: Mapping[str, Mapping[str, Any]] = document["results"]
    observed = document["observed"]
    classes = sorted({c for r in (*results.values(), observed) for c in r.get("per_class", {})})
    head = ["policy", "goodput tok/s", "compliant", *classes, "TTFT p50 s", "TTFT p95 s", "$/M compliant"]

    def row(name: str, r: Mapping[str, Any]) -> list[str]:
        shares = [_cell(r.get("per_class", {}).get(c, {}).get("compliant_share"), "{:.1%}") for c in classes]
        return [
            name,
            _cell(r.get("goodput_tokens_per_s"), "{:.1f}"),
            _cell(r.get("compliant_share"), "{:.1%}"),
            *shares,
            _cell(r.get("ttft_p50_s"), "{:.3f}"),
            _cell(r.get("ttft_p95_s"), "{:.3f}"),
            _cell(r.get("cost_per_million_goodput_tokens"), "{:.2f}"),
        ]

    draws = document.get("draws")
    which = "" if draws is None else f" (seed {document['seed']}, the first of {len(draws['seeds'])} draws)"
    lines = ["", f"replayed{which} (compliant: share of output tokens within the class's objective):"]
    lines += _aligned([head, *(row(name, r) for name, r in results.items()), row("observed", observed)])
    if draws is not None:
        first, last = draws["seeds"][0], draws["seeds"][-1]
        lines += ["", f"over the {len(draws['seeds'])} draws (seeds {first}-{last}): median [min, max]"]
        lines += _aligned([["policy", *(key for key in SELF_ERROR)], *_spread_rows(draws["figures"])])
    if ran_key is not None:
        mine = predicted(document)[ran_key]
        errors = document["self_error"]
        which = "predicted" if draws is None else "predicted (median)"
        lines += ["", f"{ran_key}, the policy that ran: {which} beside observed"]
        table = [["figure", "predicted", "observed", "error"]]
        for key, name in SELF_ERROR.items():
            fmt = _FORMATS[key]
            error = _cell(errors[key], "{:+.1%}")
            table.append([key, _cell(mine.get(name), fmt), _cell(observed.get(name), fmt), error])
        lines += _aligned(table)
    return lines


def _spread_rows(figures: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    rows = []
    for policy, by_name in figures.items():
        cells = []
        for key, name in SELF_ERROR.items():
            spread, fmt = by_name.get(name), _FORMATS[key]
            if spread is None:
                cells.append("-")
                continue
            low, high = fmt.format(spread["min"]), fmt.format(spread["max"])
            cells.append(f"{fmt.format(spread['median'])} [{low}, {high}]")
        rows.append([policy, *cells])
    return rows


_FORMATS = {"goodput": "{:.1f}", "ttft_p50": "{:.3f}", "ttft_p95": "{:.3f}", "compliant_share": "{:.1%}"}


def _cell(value: object, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _aligned(rows: list[list[str]]) -> list[str]:
    """The rows as columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  "
        + "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
