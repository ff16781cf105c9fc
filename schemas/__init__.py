"""The language every part of freshkey speaks: events, bindings, versions, the wire codec. No I/O."""

from schemas.bindings import Binding, BindingError, Bindings, parse_bindings
from schemas.codec import DecodeError, decode, encode, encode_value, message_key, row_key
from schemas.events import ChangeEvent, DdlEvent, DeadLetter, FenceEvent, Op, Source
from schemas.values import row_to_json, to_json_value
from schemas.versions import VersionError, binlog_version, column_version, gtid_version
from schemas.wire import Change, WireChange, decode_change

__all__ = [
    "Binding",
    "BindingError",
    "Bindings",
    "Change",
    "ChangeEvent",
    "DdlEvent",
    "DeadLetter",
    "DecodeError",
    "FenceEvent",
    "Op",
    "Source",
    "VersionError",
    "WireChange",
    "binlog_version",
    "column_version",
    "decode",
    "decode_change",
    "encode",
    "encode_value",
    "gtid_version",
    "message_key",
    "parse_bindings",
    "row_key",
    "row_to_json",
    "to_json_value",
]
