"""What a ``freshkey bench sysbench`` run (:mod:`pipeline.bench.sysbench`) comes to: the figures of the
report, from the run's samples, the catch-up, the worker's stats and ``freshkey verify``, and the report
as rich tables."""

from __future__ import annotations

from typing import Any

from pipeline.bench.sysbench_tool import CAUGHT_UP_TARGET_S, ROWS_PER_TRANSACTION, SysbenchConfig


def bytes_behind(end: tuple[str, int], saved: tuple[str, int] | None) -> int | None:
    """Binlog bytes between the connector's checkpoint and the end (None across a binlog rotation)."""
    if saved is None or saved[0] != end[0]:
        return None
    return max(0, end[1] - saved[1])


def sample_line(sample: dict[str, Any], total_s: int | None) -> str:
    behind = sample["connector_behind_bytes"]
    of = f"/{total_s}" if total_s else ""
    return (
        f"t={sample['t_s']:.0f}{of} s: worker applied {sample['acked'] or 0:,} changes, connector "
        f"{'?' if behind is None else f'{behind / 1e6:,.1f} MB'} of binlog behind"
    )


def _rate(samples: list[dict[str, Any]], key: str) -> float | None:
    """Per second over the samples' span (first to last)."""
    usable = [s for s in samples if s.get(key) is not None]
    if len(usable) < 2 or usable[-1]["t_s"] <= usable[0]["t_s"]:
        return None
    return float(usable[-1][key] - usable[0][key]) / float(usable[-1]["t_s"] - usable[0]["t_s"])


def figures(
    run: dict[str, Any],
    catch_up: dict[str, Any],
    stats: dict[str, Any],
    verification: dict[str, Any],
    config: SysbenchConfig,
) -> dict[str, Any]:
    sysbench = run["sysbench"]
    seconds = sysbench.get("total_time_s") or (run["ended"] - run["began"])
    changes = catch_up["acked_total"]
    start, end = run["start_position"], run["end_position"]
    binlog_bytes = end[1] - start[1] if start[0] == end[0] else None
    connector_at_end = run["connector_at_end"]
    samples = run["samples"]
    for sample in samples:
        sample["connector_bytes"] = (
            sample["connector"][1] - start[1]
            if sample["connector"] and sample["connector"][0] == start[0]
            else None
        )
    lag = stats.get("lag_ms", {})
    reports = verification.get("reports", [])
    behind = changes - run["acked_at_end"]
    return {
        "sysbench": sysbench,
        "row_changes": changes,
        "row_changes_per_s": round(changes / seconds, 1),
        "sysbench_row_changes": sysbench["transactions"] * ROWS_PER_TRANSACTION,
        "binlog_bytes": binlog_bytes,
        "binlog_bytes_per_s": round(binlog_bytes / seconds, 1) if binlog_bytes is not None else None,
        "at_sysbench_end": {
            "changes_not_applied": behind,
            "changes_applied": run["acked_at_end"],
            "connector_behind_bytes": bytes_behind(
                end, tuple(connector_at_end) if connector_at_end else None
            ),
            "caught_up_s": round(catch_up["caught_up_s"], 3),
            "connector_caught_up_s": None
            if catch_up["connector_caught_up_s"] is None
            else round(catch_up["connector_caught_up_s"], 3),
            "caught_up_within_target": catch_up["caught_up_s"] <= CAUGHT_UP_TARGET_S,
            "target_s": CAUGHT_UP_TARGET_S,
        },
        "during_run": {
            "worker_applied_per_s": _round(_rate(samples, "acked")),
            "connector_binlog_bytes_per_s": _round(_rate(samples, "connector_bytes")),
            "binlog_written_bytes_per_s": _round(
                binlog_bytes / (run["ended"] - run["began"]) if binlog_bytes is not None else None
            ),
        },
        "lag_ms": {ns: lag[ns] for ns in sorted(lag) if ns.startswith("sbtest")},
        "stages_ms": stats.get("stages_ms", {}),
        "processes": {"run": run["processes"], "catch_up": catch_up["processes"]},
        "cpu_us_per_change": _cpu_per_change(run["processes"], catch_up["processes"], changes),
        "background_cores": {"run": run["background_cores"], "catch_up": catch_up["background_cores"]},
        "verify": {
            "exit_code": verification["exit_code"],
            "checked": verification.get("checked", 0),
            "stale": verification.get("stale", 0),
            "in_flight": verification.get("in_flight", 0),
            "missing": sum(r.get("missing", 0) for r in reports),
            "rows": sum(r.get("rows", 0) for r in reports),
            "unverifiable": verification.get("unverifiable", []),
            "nines_text": verification.get("nines_text"),
        },
        "samples": samples,
    }


def _cpu_per_change(
    run: dict[str, dict[str, float]], catch_up: dict[str, dict[str, float]], changes: int
) -> dict[str, float]:
    """CPU µs per row change of the processes that handle every change (over the run and the catch-up
    together): what following sysbench's rate costs each, whatever the machine left it."""
    return {
        name: round(
            (run[name]["cpu_s"] + catch_up.get(name, {}).get("cpu_s", 0.0)) / max(1, changes) * 1e6, 1
        )
        for name in ("connector", "kafka", "worker", "redis")
        if name in run
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def render(report: dict[str, Any], console: Any) -> None:
    """The report as rich tables."""
    from rich.table import Table

    config, sysbench, end = report["config"], report["sysbench"], report["at_sysbench_end"]
    rate = config.get("rate", 0)
    pace = f"throttled to {rate:,} tps" if rate else "unthrottled"
    table = Table(
        title=f"freshkey bench sysbench: oltp_write_only, {config['threads']} threads, {config['time_s']} s "
        f"{pace}, {config['tables']} x {config['table_size']:,} rows"
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    verify = report["verify"]
    during = report["during_run"]

    def num(value: Any, fmt: str = ",.0f") -> str:
        return "-" if value is None else format(value, fmt)

    rows = [
        ("sysbench tps (transactions/s)", num(sysbench.get("transactions_per_s"), ",.1f")),
        (
            "sysbench latency avg / p95 (ms)",
            f"{num(sysbench.get('latency_avg_ms'), '.2f')} / {num(sysbench.get('latency_p95_ms'), '.2f')}",
        ),
        (
            "row changes applied (per s of sysbench)",
            f"{report['row_changes']:,} ({num(report['row_changes_per_s'])}/s)",
        ),
        (
            "binlog written (MB/s)",
            num(during["binlog_written_bytes_per_s"] and during["binlog_written_bytes_per_s"] / 1e6, ".2f"),
        ),
        (
            "connector read rate during the run (MB/s)",
            num(
                during["connector_binlog_bytes_per_s"] and during["connector_binlog_bytes_per_s"] / 1e6, ".2f"
            ),
        ),
        ("worker applied rate during the run (changes/s)", num(during["worker_applied_per_s"])),
        ("at sysbench's end: changes not yet applied", f"{end['changes_not_applied']:,}"),
        (
            "at sysbench's end: connector behind (MB of binlog)",
            num(end["connector_behind_bytes"] and end["connector_behind_bytes"] / 1e6, ".2f"),
        ),
        ("connector at the binlog end after (s)", num(end["connector_caught_up_s"], ".2f")),
        (
            f"caught up after (s; target {end['target_s']:g})",
            f"[{'green' if end['caught_up_within_target'] else 'red'}]{end['caught_up_s']:.2f}[/]",
        ),
    ]
    for namespace, summary in report["lag_ms"].items():
        rows.append(
            (
                f"lag p50 / p99 / max, {namespace} (ms)",
                f"{num(summary.get('p50'), ',.1f')} / {num(summary.get('p99'), ',.1f')} / "
                f"{num(summary.get('max'), ',.1f')}",
            )
        )
    rows += [
        (
            "verify: checked / stale / in flight / missing",
            f"{verify['checked']:,} / [{'red' if verify['stale'] else 'green'}]{verify['stale']}[/] / "
            f"{verify['in_flight']} / {verify['missing']}",
        ),
        (
            "other load on the machine, run / catch-up (cores)",
            f"{report['background_cores']['run']:.2f} / {report['background_cores']['catch_up']:.2f}",
        ),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    cpu = Table(title="CPU per process (µs per change: run and catch-up together; cores at sysbench's rate)")
    cpu.add_column("process")
    cpu.add_column("s during the run", justify="right")
    cpu.add_column("s catch-up", justify="right")
    cpu.add_column("µs per change", justify="right")
    cpu.add_column("cores at sysbench's rate", justify="right")
    processes, per_change = report["processes"], report["cpu_us_per_change"]
    for name in dict.fromkeys([*processes["run"], *processes["catch_up"]]):
        us = per_change.get(name)
        cpu.add_row(
            name,
            num(processes["run"].get(name, {}).get("cpu_s"), ".2f"),
            num(processes["catch_up"].get(name, {}).get("cpu_s"), ".2f"),
            num(us, ",.1f"),
            num(None if us is None else us * report["row_changes_per_s"] / 1e6, ".2f"),
        )
    console.print(cpu)
