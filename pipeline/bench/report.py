"""The figures of ``freshkey bench pipeline``: medians over runs, ratios, and the tables it prints.

:func:`summarize` turns the report of :class:`pipeline.bench.pipeline.PipelineBench` (every run of
every scenario) into median / min / max per figure. Ratios are taken per run (both figures measured
minutes apart at most, on the same services) and then summarised, because on a shared machine the
ratio of two figures measured side by side is steadier than either figure. :func:`render` prints the
tables with rich. Both are pure: they work on the JSON the command writes.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pipeline.observe.series import stage_order

SCENARIO_LABELS = {
    "raw-decode": "raw decode",
    "raw-redis": "raw Redis CAS",
    "connector": "connector alone",
    "worker": "worker alone",
    "e2e": "end to end",
    "workers-2": "2 workers",
}
LEGEND = (
    "raw decode: plain pymysqlreplication over the backlog, in the bench process; raw Redis CAS: "
    "pipelined EVALSHA of write_if_newer.lua, 500 per round trip, one process; connector alone: backlog "
    "to Kafka-acknowledged checkpoint; worker alone: a filled change topic drained into Redis; end to "
    "end: connector + worker; 2 workers: one consumer group. others: cores the rest of the machine used "
    "meanwhile (processes not the bench's): a figure measured while it is high is slower than the code."
)
RATIOS = {
    "connector / raw decode": ("connector", "raw-decode"),
    "worker / raw Redis": ("worker", "raw-redis"),
    "e2e / raw decode": ("e2e", "raw-decode"),
    "2 workers / 1 worker": ("workers-2", "worker"),
}
"""Ratio label -> (numerator, denominator) scenario; the row of the numerator shows it."""
SERVICES = ("mariadb", "kafka", "redis")
NOTES = (
    LEGEND,
    "connector alone stops its clock at the checkpoint file's mtime; the connector saves it at most every "
    "0.1 s, so that figure can be up to 0.1 s long.",
    "CPU µs per change: CPU seconds of each process over the measured interval divided by the changes; "
    "it depends less on the machine's load than the rates do, but contention inflates it too.",
    "rejoins: consumer group (re)joins logged by the workers during a measurement; a figure with any "
    "includes a rebalance stall.",
)
BUSY_CORES = 0.5
"""Above this many cores used by other processes (median over a table's figures), the tables say so."""


def spread(values: Iterable[float]) -> dict[str, float | int]:
    """``{"median", "min", "max", "runs"}`` of ``values`` (at least one)."""
    items = list(values)
    if not items:
        raise ValueError("no values")
    return {
        "median": round(statistics.median(items), 4),
        "min": round(min(items), 4),
        "max": round(max(items), 4),
        "runs": len(items),
    }


def summarize(report: Mapping[str, Any]) -> dict[str, Any]:
    """Median / min / max over runs of every figure, and the per-run ratios."""
    summary: dict[str, Any] = {"backlogs": {}, "rates": {}}
    for kind, entry in report.get("backlogs", {}).items():
        runs = entry.get("runs", [])
        scenarios: dict[str, Any] = {}
        for name in SCENARIO_LABELS:
            records = [run[name] for run in runs if name in run]
            if records:
                scenarios[name] = {
                    "per_s": spread(r["per_s"] for r in records),
                    "seconds": spread(r["seconds"] for r in records),
                    "processes": _processes(records),
                    "background_cores": spread(float(r.get("background_cores", 0.0)) for r in records),
                    "rejoins": sum(int(r.get("rejoins", 0)) for r in records),
                }
        ratios = {
            label: spread(run[a]["per_s"] / run[b]["per_s"] for run in runs if a in run and b in run)
            for label, (a, b) in RATIOS.items()
            if any(a in run and b in run for run in runs)
        }
        summary["backlogs"][kind] = {
            "rows": entry.get("rows"),
            "transactions": entry.get("transactions"),
            "scenarios": scenarios,
            "ratios": ratios,
        }
    by_rate: dict[float, list[Mapping[str, Any]]] = {}
    for run in report.get("rates", {}).get("runs", []):
        by_rate.setdefault(float(run["rate"]), []).append(run)
    for rate, runs in sorted(by_rate.items()):
        stages = sorted({stage for run in runs for stage in run.get("stages_ms", {})})
        summary["rates"][f"{rate:g}"] = {
            "rate": rate,
            "changes": spread(run["changes"] for run in runs),
            "driven_per_s": spread(run["driven_per_s"] for run in runs),
            "throughput_per_s": spread(run["throughput_per_s"] for run in runs),
            "catch_up_s": spread(run["catch_up_s"] for run in runs),
            "sustained_runs": sum(bool(run["sustained"]) for run in runs),
            "reached_rate_runs": sum(bool(run["reached_rate"]) for run in runs),
            "runs": len(runs),
            "lag_ms": _percentiles(run.get("lag_ms") or {} for run in runs),
            "broker_lag_ms": _percentiles(run.get("broker_lag_ms") or {} for run in runs),
            "stages_ms": {
                stage: _percentiles(run.get("stages_ms", {}).get(stage) or {} for run in runs)
                for stage in stages
            },
            "processes": _processes(runs),
            "background_cores": spread(float(run.get("background_cores", 0.0)) for run in runs),
            "rejoins": sum(int(run.get("rejoins", 0)) for run in runs),
        }
    return summary


def _percentiles(figures: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    items = list(figures)
    result: dict[str, Any] = {}
    for name in ("p50", "p99", "max"):
        values = [float(f[name]) for f in items if f.get(name) is not None]
        if values:
            result[name] = spread(values)
    return result


def _processes(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    collected: dict[str, dict[str, list[float]]] = {}
    for record in records:
        for process, figures in record.get("processes", {}).items():
            for figure, value in figures.items():
                collected.setdefault(process, {}).setdefault(figure, []).append(float(value))
    return {
        process: {figure: spread(values) for figure, values in figures.items()}
        for process, figures in collected.items()
    }


# -- printing -----------------------------------------------------------------------------------------


def _rate(value: float) -> str:
    return f"{value:,.0f}"


def _median_range(figure: Mapping[str, Any] | None, fmt: str = "{:,.0f}") -> str:
    if not figure:
        return "-"
    text = fmt.format(figure["median"])
    if figure["runs"] > 1:
        text += f" [{fmt.format(figure['min'])}-{fmt.format(figure['max'])}]"
    return text


def _cpu(processes: Mapping[str, Any], key: str) -> str:
    """Median CPU µs per item of each process that used any, freshkey processes first."""
    shown = []
    for name, figures in sorted(processes.items(), key=lambda item: (item[0] in SERVICES, item[0])):
        value = figures.get(key, {}).get("median", 0.0)
        if value >= 0.05:
            shown.append(f"{name} {value:,.0f}")
    return " · ".join(shown) or "-"


def _rss(processes: Mapping[str, Any]) -> str:
    shown = [
        f"{name} {figures['peak_rss_mib']['max']:,.0f}"
        for name, figures in sorted(processes.items())
        if name not in SERVICES and "peak_rss_mib" in figures
    ]
    return " · ".join(shown) or "-"


def render(report: Mapping[str, Any], summary: Mapping[str, Any], console: Console) -> None:
    """Print the backlog tables, the fixed-rate table and the per-stage lag table."""
    runs = report.get("config", {}).get("runs")
    for kind, entry in summary.get("backlogs", {}).items():
        what = (
            f"{entry['transactions']:,} single-row transactions"
            if kind == "single"
            else f"{entry['transactions']:,} INSERTs of {entry['rows'] // max(1, entry['transactions']):,}"
            " rows"
        )
        table = Table(title=escape(f"backlog '{kind}': {what} — median [min-max] of {runs} run(s)"))
        for column in (
            "scenario",
            "rows or changes/s",
            "ratio",
            "CPU µs per change",
            "peak RSS MiB",
            "others",
        ):
            table.add_column(column, justify="left" if column == "scenario" else "right")
        ratio_of = {a: (label, entry["ratios"].get(label)) for label, (a, _) in RATIOS.items()}
        for name, figures in entry["scenarios"].items():
            label, ratio = ratio_of.get(name, ("", None))
            table.add_row(
                SCENARIO_LABELS[name] + (" ⚠ rejoined" if figures.get("rejoins") else ""),
                _median_range(figures["per_s"]),
                f"{label}: {_median_range(ratio, '{:.2f}x')}" if ratio else "",
                _cpu(figures["processes"], "cpu_us_per_item"),
                _rss(figures["processes"]),
                _median_range(figures["background_cores"], "{:.1f}"),
            )
        console.print(table)
    if summary.get("backlogs"):
        console.print(LEGEND)
    _render_rates(summary.get("rates", {}), console)
    _warn_if_busy(summary, console)


def _render_rates(rates: Mapping[str, Any], console: Console) -> None:
    if not rates:
        return
    table = Table(
        title=escape(
            "fixed rates — single-row updates, median [min-max]; sustained: throughput ≥ 0.95x driven "
            "and catch-up ≤ 2 s"
        )
    )
    for column in (
        "rate/s",
        "driven/s",
        "throughput/s",
        "catch-up s",
        "lag p50 ms",
        "lag p99 ms",
        "lag max ms",
    ):
        table.add_column(column, justify="right")
    table.add_column("sustained", justify="right")
    for entry in rates.values():
        lag = entry["lag_ms"]
        sustained = f"{entry['sustained_runs']}/{entry['runs']}"
        if entry["reached_rate_runs"] < entry["runs"]:
            sustained += f" (driver short in {entry['runs'] - entry['reached_rate_runs']})"
        table.add_row(
            _rate(entry["rate"]),
            _median_range(entry["driven_per_s"]),
            _median_range(entry["throughput_per_s"]),
            _median_range(entry["catch_up_s"], "{:.2f}"),
            _median_range(lag.get("p50"), "{:.1f}"),
            _median_range(lag.get("p99"), "{:.1f}"),
            _median_range(lag.get("max"), "{:.1f}"),
            sustained,
        )
    console.print(table)
    broker = any(entry.get("broker_lag_ms") for entry in rates.values())
    stages = Table(
        title="lag per stage at each rate (ms, medians over runs): p50 / p99 / max",
        caption="the broker alone: right after each run, at the same rate and without freshkey, a plain "
        "producer sending as the connector does (each change pushed) and a plain consumer fetching as "
        "the worker does"
        if broker
        else None,
    )
    stages.add_column("stage")
    for entry in rates.values():
        stages.add_column(f"{_rate(entry['rate'])}/s", justify="right")
    names: list[str] = []
    for entry in rates.values():
        names += [stage for stage in entry["stages_ms"] if stage not in names]
    for stage in sorted(names, key=stage_order):
        cells = []
        for entry in rates.values():
            figures = entry["stages_ms"].get(stage, {})
            cells.append(
                " / ".join(
                    f"{figures[q]['median']:.1f}" if q in figures else "-" for q in ("p50", "p99", "max")
                )
            )
        stages.add_row(stage, *cells)
    if broker:
        stages.add_row(
            "the broker alone",
            *(
                " / ".join(
                    f"{entry['broker_lag_ms'][q]['median']:.1f}"
                    if q in entry.get("broker_lag_ms", {})
                    else "-"
                    for q in ("p50", "p99", "max")
                )
                for entry in rates.values()
            ),
        )
    console.print(stages)
    cpu = Table(title="CPU µs per change and peak RSS at each rate (medians over runs)")
    cpu.add_column("rate/s", justify="right")
    cpu.add_column("CPU µs per change", justify="right")
    cpu.add_column("peak RSS MiB", justify="right")
    cpu.add_column("others (cores)", justify="right")
    for entry in rates.values():
        cpu.add_row(
            _rate(entry["rate"]),
            _cpu(entry["processes"], "cpu_us_per_item"),
            _rss(entry["processes"]),
            _median_range(entry["background_cores"], "{:.1f}"),
        )
    console.print(cpu)


def _warn_if_busy(summary: Mapping[str, Any], console: Console) -> None:
    """Say so when the machine was busy with other work while the bench measured."""
    medians = [
        figures["background_cores"]["median"]
        for entry in summary.get("backlogs", {}).values()
        for figures in entry["scenarios"].values()
    ] + [entry["background_cores"]["median"] for entry in summary.get("rates", {}).values()]
    if medians and statistics.median(medians) > BUSY_CORES:
        console.print(
            f"[yellow]⚠ other processes used {statistics.median(medians):.1f} cores on average while "
            "figures were measured: rates are lower than the code allows; compare the ratios (measured side "
            "by side) and CPU per change, or rerun on a quiet machine.[/yellow]"
        )
