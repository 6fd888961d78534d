"""Human-readable output of a comparison, drawn with rich: progress bars on stderr and tables."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from sim.loop.deciders import caption

if TYPE_CHECKING:
    from sim.evaluation.compare import ProgressFactory

TABLE_WIDTH = 10_000
"""Width of a console the tables are printed on: so wide that rich never wraps or truncates a
cell, while a table itself takes only its natural width (17 columns do not fit 80)."""

_COLUMNS = (
    ("policy", "{}"),
    ("done", "{}"),
    ("abort", "{}"),
    ("rej", "{}"),
    ("regret", "{}"),
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
    ("$/Mgood", "{:.2f}"),
    ("busy", "{:.1%}"),
    ("pred err", "{:.1%}"),
    ("p50/ideal", "{:.2f}x"),
)
_KEYS = (
    None,
    "completed",
    "aborted",
    "rejected",
    "rejected_met_without_admission",
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
    "cost_per_million_goodput_tokens",
    "busy_fraction",
    "ttft_prediction_mape",
    None,
)


def _cell(fmt: str, value: Any) -> str:
    # A missing latency is one no request reached (infinite, ``null`` in JSON); a missing share
    # or count is "not counted".
    if value is None:
        return "inf" if "." in fmt and "%" not in fmt else "-"
    return fmt.format(value)


def comparison(document: Mapping[str, Any]) -> Group:
    """A header line, then one table per section: every policy's totals, then one per SLO class
    (when there are several), a row per policy; then the fleet's shape per run (``_shape``)."""
    results: Mapping[str, Mapping[str, Any]] = document["results"]
    sections = [("all requests", dict(results))]
    classes = sorted({c for r in results.values() for c in r.get("per_class", {})})
    if len(classes) > 1:
        for cls in classes:
            sections.append(
                (cls, {n: r["per_class"][cls] for n, r in results.items() if cls in r["per_class"]})
            )
    header = (
        f"workload {document['workload']} | fleet {document['fleet']} | rate x{document['rate_scale']}"
        f" | seed {document['seed']} | {document['requests']} requests over {document['window_s']:.0f} s"
        f"{caption(document)}"
    )
    # Violations are judged per run, not per class: the column is in the first table only,
    # and only when the fleet was a file (a COUNTxPROFILE fleet has no rules to break).
    judged = any("violations" in r for r in results.values())
    parts: list[RenderableType] = [Text(header)]
    for index, (title, rows) in enumerate(sections):
        parts += [Text(""), _section(title, rows, violations=judged and index == 0)]
    shaped = {name: r for name, r in results.items() if "gpu_hours" in r}
    if shaped:
        parts += [Text(""), _shape(shaped)]
    return Group(*parts)


_SHAPE_COLUMNS = (
    ("planner", "planner", "{}"),
    ("GPU-h", "gpu_hours", "{:.2f}"),
    ("$/Mgood", "cost_per_million_goodput_tokens", "{:.2f}"),
    ("goodput", "goodput_tokens_per_s", "{:.0f}"),
    ("starts", "replica_starts", "{}"),
    ("cold", "cold_starts", "{}"),
    ("warm", "warm_starts", "{}"),
    ("ready p50", "p50", "{:.0f}"),
    ("p95", "p95", "{:.0f}"),
    ("lost in scale-down", "lost_in_scale_down", "{}"),
)


def _shape(rows: Mapping[str, Mapping[str, Any]]) -> Table:
    """The fleet's shape per run: who planned it, GPU-hours held, what a compliant token cost,
    replica starts (cold, warm), start-to-ready seconds and requests lost in scale-down."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    table.add_column(Text("fleet shape"), justify="left", no_wrap=True)
    for name, _, _ in _SHAPE_COLUMNS:
        table.add_column(Text(name), justify="right", no_wrap=True)
    for name, metrics in rows.items():
        ready = metrics.get("time_to_ready_s") or {}
        values = [
            ready.get(key) if key in ("p50", "p95") else metrics.get(key) for _, key, _ in _SHAPE_COLUMNS
        ]
        cells = [
            name,
            *(
                "-" if v is None else fmt.format(v)
                for (_, _, fmt), v in zip(_SHAPE_COLUMNS, values, strict=True)
            ),
        ]
        table.add_row(*(Text(c) for c in cells))
    return table


def _section(title: str, rows: Mapping[str, Mapping[str, Any]], violations: bool = False) -> Table:
    """One table, a row per policy; ``violations``: a last column with each run's total
    violations of the fleet's rules ("-" for a bound, which is not a router)."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    table.add_column(Text(title), justify="left", no_wrap=True)
    for name, _ in _COLUMNS[1:]:
        table.add_column(Text(name), justify="right", no_wrap=True)
    if violations:
        table.add_column(Text("violations"), justify="right", no_wrap=True)
    ideal_p50 = rows.get("ideal", {}).get("ttft_p50_s")
    for name, metrics in rows.items():
        cells = [name]
        for (_, fmt), key in zip(_COLUMNS[1:], _KEYS[1:], strict=True):
            if key is None:
                p50 = metrics.get("ttft_p50_s")
                ratio = p50 / ideal_p50 if p50 is not None and ideal_p50 else None
                cells.append(_cell(fmt, ratio) if ratio is not None else "-")
            else:
                cells.append(_cell(fmt, metrics.get(key)))
        if violations:
            cells.append(_cell("{}", (metrics.get("violations") or {}).get("total")))
        table.add_row(*(Text(c) for c in cells))  # Text: a name is never read as rich markup
    return table


def format_table(document: Mapping[str, Any]) -> str:
    """The comparison (see ``comparison``) as plain aligned text, without colours."""
    console = Console(width=TABLE_WIDTH, color_system=None, highlight=False)
    with console.capture() as captured:
        console.print(comparison(document))
    return "\n".join(line.rstrip() for line in captured.get().splitlines())


@contextmanager
def progress_bar(console: Console | None = None) -> Iterator[ProgressFactory]:
    """A factory of per-policy progress callbacks (``compare``'s ``progress``), valid inside
    the ``with``. On a terminal, one rich bar per policy; otherwise (a log file, CI) one line as
    each policy starts, so a log is not flooded with redraws. ``console``: stderr by default."""
    console = console or Console(stderr=True, highlight=False)
    if not console.is_terminal:

        def announce(policy: str, total: int) -> Callable[[int], None]:
            console.print(Text(f"simulating {policy}: {total} arrivals"))
            return lambda done: None

        yield announce
        return
    columns = (
        TextColumn("{task.description:>18}", markup=False),
        BarColumn(bar_width=30),
        MofNCompleteColumn(),
        TextColumn("arrivals"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:

        def factory(policy: str, total: int) -> Callable[[int], None]:
            task = progress.add_task(policy, total=total)

            def tick(done: int) -> None:
                progress.update(task, completed=done)

            return tick

        yield factory
