"""What the connector's producer tells a sound log from one that went back by (:class:`AckedOffsets`)."""

from __future__ import annotations

import bisect

MAX_SPANS = 64
"""Most separate runs of acknowledged offsets kept per partition (:class:`AckedOffsets`)."""


class AckedOffsets:
    """The offsets of one partition that Kafka acknowledged in this session, as sorted, merged
    ``[start, end)`` runs: what tells a log that went back from delivery reports that came out of order.

    Reports are not served in offset order: the caller's thread and the background thread both serve
    them (``ChangeProducer.serve``), and each runs the callbacks of the reports it took, so a later
    batch's can run first. An offset is never acknowledged twice for different messages on a sound log,
    whatever the order: :meth:`add` says when one is. The runs stay few (acknowledgements come nearly in
    order and fill the holes they leave); past :data:`MAX_SPANS` (other producers writing to the
    partition) the oldest are forgotten."""

    __slots__ = ("spans",)

    def __init__(self) -> None:
        self.spans: list[list[int]] = []

    def add(self, offset: int) -> bool:
        """Record ``offset``; False when it had been acknowledged before (the log went back)."""
        spans = self.spans
        if spans and spans[-1][1] == offset:  # the next one: nearly every call
            spans[-1][1] = offset + 1
            return True
        i = bisect.bisect_right(spans, offset, key=lambda span: span[0])  # spans[:i] start at or below
        if i and spans[i - 1][1] > offset:
            return False
        joins_left = i > 0 and spans[i - 1][1] == offset
        joins_right = i < len(spans) and spans[i][0] == offset + 1
        if joins_left and joins_right:
            spans[i - 1][1] = spans[i][1]
            del spans[i]
        elif joins_left:
            spans[i - 1][1] = offset + 1
        elif joins_right:
            spans[i][0] = offset
        else:
            spans.insert(i, [offset, offset + 1])
            if len(spans) > MAX_SPANS:
                del spans[0]
        return True
