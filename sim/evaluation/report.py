"""Human-readable output of a comparison: a progress bar on stderr and a table."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

_COLUMNS = (
    ("policy", "{}"),
    ("done", "{}"),
    ("abort", "{}"),
    ("rej", "{}"),
    ("retry", "{}"),
    ("TTFT p50", "{:.3f}"),
    ("p95", "{:.3f}"),
    ("p99", "{:.3f}"),
    ("TPOT p50", "{:.4f}"),
    ("E2E p95", "{:.2f}"),
    ("hit", "{:.1%}"),
    ("out tok/s", "{:.0f}"),
    ("goodput", "{:.0f}"),
    ("compliant", "{:.1%}"),
    ("busy", "{:.1%}"),
    ("pred err", "{:.1%}"),
    ("p50/ideal", "{:.2f}x"),
)
_KEYS = (
    None,
    "completed",
    "aborted",
    "rejected",
    "retried",
    "ttft_p50_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "e2e_p95_s",
    "cache_hit_ratio",
    "output_tokens_per_s",
    "goodput_tokens_per_s",
    "compliant_share",
    "busy_fraction",
    "ttft_prediction_mape",
    None,
)


def _cell(fmt: str, value: Any) -> str:
    if value is None:
        return "inf" if "." in fmt and "%" not in fmt else "-"
    return fmt.format(value)


def format_table(document: Mapping[str, Any]) -> str:
    """One row per policy (totals), then one block per SLO class, as aligned text."""
    results: Mapping[str, Mapping[str, Any]] = document["results"]
    sections = [("all requests", {name: r for name, r in results.items()})]
    classes = sorted({c for r in results.values() for c in r.get("per_class", {})})
    if len(classes) > 1:
        for cls in classes:
            sections.append(
                (cls, {n: r["per_class"][cls] for n, r in results.items() if cls in r["per_class"]})
            )
    lines = [
        f"workload {document['workload']} | fleet {document['fleet']} | rate x{document['rate_scale']}"
        f" | seed {document['seed']} | {document['requests']} requests over {document['window_s']:.0f} s"
    ]
    for title, rows in sections:
        ideal_p50 = rows.get("ideal", {}).get("ttft_p50_s")
        table = [[title] + [c for c, _ in _COLUMNS[1:]]]
        for name, metrics in rows.items():
            cells = [name]
            for (_, fmt), key in zip(_COLUMNS[1:], _KEYS[1:], strict=True):
                if key is None:
                    p50 = metrics.get("ttft_p50_s")
                    ratio = p50 / ideal_p50 if p50 is not None and ideal_p50 else None
                    cells.append(_cell(fmt, ratio) if ratio is not None else "-")
                else:
                    cells.append(_cell(fmt, metrics.get(key)))
            table.append(cells)
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        lines.append("")
        for row in table:
            lines.append(
                "  ".join(
                    c.ljust(w) if i == 0 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(row, widths, strict=True))
                )
            )
    return "\n".join(lines)


def progress_bar(stream: TextIO = sys.stderr) -> Callable[[str, int], Callable[[int], None]]:
    """A factory of per-policy progress callbacks drawing ``[policy] ####---- n/total``."""

    def factory(policy: str, total: int) -> Callable[[int], None]:
        started = time.perf_counter()
        interactive = stream.isatty()
        last_decile = -1

        def tick(done: int) -> None:
            nonlocal last_decile
            share = done / max(total, 1)
            decile = int(share * 10)
            if not interactive and decile == last_decile:
                return
            last_decile = decile
            bar = "#" * int(share * 30)
            text = f"[{policy:>18}] {bar:<30} {done}/{total} arrivals  {time.perf_counter() - started:.1f}s"
            stream.write(("\r" + text) if interactive else text + "\n")
            if interactive and done >= total:
                stream.write("\n")
            stream.flush()

        return tick

    return factory
