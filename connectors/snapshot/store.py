"""The snapshot's progress on disk, beside the connector's checkpoint (``checkpoint.snapshot.json``).

Written like the checkpoint (temporary file, fsync, rename), each time a chunk's rows are acknowledged
by Kafka and when a request is taken or cancelled, so a connector killed mid-snapshot resumes after the
last chunk Kafka has. An unreadable file does not stop the connector (the stream matters more): it is
set aside (``.unreadable``) with an ERROR line, and the next request starts over.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pydantic import ValidationError

from connectors.snapshot.model import SnapshotState

log = logging.getLogger(__name__)


class SnapshotStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> SnapshotState | None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.error("cannot read the snapshot progress %s (%s): a snapshot starts over", self.path, exc)
            return None
        try:
            return SnapshotState.model_validate_json(text)
        except ValidationError as exc:
            aside = self.path.with_name(self.path.name + ".unreadable")
            log.error(
                "the snapshot progress %s is unreadable (%s); moved to %s: the next snapshot starts over",
                self.path,
                exc.errors(include_url=False)[:1],
                aside,
            )
            os.replace(self.path, aside)
            return None

    def save(self, state: SnapshotState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w") as fh:
            fh.write(state.model_dump_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
