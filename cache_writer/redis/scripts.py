"""The Lua scripts of the Redis tiers, each loaded once from ``cache_writer/lua`` with the shared prelude.

Every script starts with ``lua/prelude.lua`` (the version comparator, the server clock and the common
tail of a write), so a rule that several scripts share is written once. Scripts are called with EVALSHA;
a NOSCRIPT reply (a restarted server, a flushed script cache, a new cluster node) reloads them
(``cache_writer.redis.pipeline``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    text: str
    sha: str


def _read(name: str) -> str:
    return resources.files("cache_writer").joinpath("lua", name).read_text()


PRELUDE = _read("prelude.lua")


def load_script(name: str) -> Script:
    """The script ``lua/<name>`` with the prelude in front (its SHA-1 is what EVALSHA names)."""
    text = PRELUDE + "\n" + _read(name)
    return Script(name, text, hashlib.sha1(text.encode()).hexdigest())


WRITE = load_script("write_if_newer.lua")
INVALIDATE = load_script("invalidate_if_not_newer.lua")
GET_OR_LEASE = load_script("get_or_lease.lua")
FILL = load_script("fill_with_lease.lua")
SET_SIGNATURE = load_script("set_signature.lua")
CLEAR_PENDING = load_script("clear_pending.lua")
SWEEP_ENTRY = load_script("sweep_entry.lua")

ALL = (WRITE, INVALIDATE, GET_OR_LEASE, FILL, SET_SIGNATURE, CLEAR_PENDING, SWEEP_ENTRY)
