"""One root for every error freshkey raises, in four categories that say what to do about it.

- :class:`Unavailable`: a service (the database, Kafka, a Redis tier, the model weights) is out of reach
  now. Retry with backoff, say so, never skip: nothing is acknowledged past it.
- :class:`InvalidInput`: one message, row or update cannot be processed. It becomes a dead letter with
  the reason (and a bounded copy of the original) and the stream goes on.
- :class:`Misconfigured`: the settings, the bindings or the source server are not usable. The command
  exits with status 2 and a message that says what to change.
- :class:`Fatal`: the process cannot go on (a bug, retries given up). It exits non-zero so that its
  supervisor restarts it; nothing unacknowledged is lost.

Third-party errors keep their own classes; the places that catch them (``pipeline.outages``, the
connector's session loop) map them onto these categories.
"""

from __future__ import annotations


class FreshkeyError(Exception):
    """Root of every error freshkey raises."""


class Unavailable(FreshkeyError):
    """A service is out of reach now: retry with backoff, never skip."""


class InvalidInput(FreshkeyError, ValueError):
    """One input cannot be processed: dead-letter it with the reason, and go on."""


class Misconfigured(FreshkeyError, ValueError):
    """Settings, bindings or the source server are not usable: exit 2 with what to change."""


class Fatal(FreshkeyError):
    """The process cannot go on: exit non-zero, so that a supervisor restarts it."""
