"""``freshkey connector``: read the binlog of the bound tables into the change topic."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Annotated

import typer

from connectors.exceptions import ConnectorError, RetriesExhaustedError
from connectors.snapshot.model import SnapshotTable
from pipeline.commands import EnvFile
from pipeline.config import AllSettings, load_bindings, setup_logging
from schemas import Bindings

log = logging.getLogger(__name__)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def fence_hook(settings: AllSettings, bindings: Bindings) -> Callable[[str], None]:
    """The connector's ``on_gap``: fence every bound namespace (``pipeline.fence.fence_all``), so that
    nothing cached before a gap is ever served. Raising makes the connector retry it before producing."""

    def on_gap(reason: str) -> None:
        from pipeline.fence import fence_all

        namespaces = fence_all(settings, bindings, reason)
        log.warning("fenced %d namespace(s) after a gap: %s", len(namespaces), ", ".join(namespaces))

    return on_gap


def snapshot_tables(bindings: Bindings, namespaces: Sequence[str] = ()) -> list[SnapshotTable]:
    """The tables a snapshot reads: the bindings of ``namespaces`` (all when empty) whose changes write
    the cache. An ``on_change: invalidate`` binding is left out unless named: its rows would only
    invalidate (applications fill after a miss), which a fence does in one step."""
    named = set(namespaces)
    return [
        SnapshotTable(db=b.database, table=b.table_name, label=b.namespace)
        for b in bindings.bindings
        if b.namespace in named or (not named and b.on_change == "write")
    ]


def connector(
    env_file: EnvFile = None,
    log_level: Annotated[str, typer.Option("--log-level")] = "INFO",
    accept_gap: Annotated[
        bool,
        typer.Option(
            "--accept-gap",
            help="When the checkpoint's binlog is gone (purged) or the checkpoint unreadable: fence every "
            "bound namespace (nothing cached before is served), then continue from the current binlog "
            "position instead of stopping. Changes in the gap are not replayed: add --snapshot, or run "
            "`freshkey snapshot` afterwards, to refill.",
        ),
    ] = False,
    snapshot: Annotated[
        bool,
        typer.Option(
            "--snapshot",
            help="After any gap this connector fences (a purged binlog with --accept-gap, a change topic "
            "that lost events), snapshot every bound table of an on_change: write binding to refill the "
            "caches (asked for before the fence, so it runs even if the connector dies in between). "
            "Follow it with `freshkey snapshot --status`.",
        ),
    ] = False,
) -> None:
    """Run the binlog connector until interrupted (SIGINT/SIGTERM stop it cleanly).

    It reconnects by itself to the database and the broker (FRESHKEY_CONNECTOR_RETRY_*). Exit codes:
    2 for a configuration to change (the message says what), 1 when it gave up retrying.
    """
    from connectors.runner import run_connector
    from pipeline.observe.otel import configure_telemetry

    setup_logging(log_level)
    settings = AllSettings.load(env_file)
    bindings = load_bindings(settings.bindings_path)
    configure_telemetry(settings.telemetry, service="connector")
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        run_connector(
            settings.mysql,
            settings.kafka,
            settings.connector,
            list(bindings.tables()),
            on_gap=fence_hook(settings, bindings),
            accept_gap=accept_gap,
            snapshot_after_gap=snapshot_tables(bindings) if snapshot else (),
        )
    except KeyboardInterrupt:
        pass
    except RetriesExhaustedError as exc:
        typer.echo(f"freshkey connector: {exc}", err=True)
        raise typer.Exit(1) from None
    except ConnectorError as exc:
        typer.echo(f"freshkey connector: {exc}", err=True)
        raise typer.Exit(2) from None
