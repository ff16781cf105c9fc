"""Snapshots with watermarks: the bound tables read in primary-key chunks while the stream runs.

``freshkey snapshot`` asks the connector through the signalling table (:mod:`.signals`); the connector
reads each chunk between a low and a high watermark and sends, at the high watermark, the rows that did
not change in between as ``op: "r"`` events with its version (:mod:`.window`), counts a chunk once Kafka
acknowledged it (:mod:`.model`) and keeps the progress beside its checkpoint (:mod:`.store`), all driven
by :mod:`.coordinator`. :mod:`.reader` reads the chunks.
"""

from connectors.snapshot.coordinator import SnapshotCoordinator
from connectors.snapshot.model import SnapshotRequest, SnapshotState, SnapshotTable, TableProgress
from connectors.snapshot.signals import SignalTable

__all__ = [
    "SignalTable",
    "SnapshotCoordinator",
    "SnapshotRequest",
    "SnapshotState",
    "SnapshotTable",
    "TableProgress",
]
