"""What config replicas say to each other, as messages on the configuration's topic.

Three kinds, JSON objects (small, debuggable with `episub subscribe --json`):
- update:   {"op": "update", "version": V, "writer": HEX, "set": {key: [kind, data]}}
            one write (set, update or delete of several keys), all stamped (V, writer).
- sync:     {"op": "sync", "from": HEX, "to": HEX, "version": V}
            a replica that joined late, restarted, or noticed a gap asks the neighbour
            `to` for its snapshot; V is what it has, so a neighbour with no more stays quiet.
- snapshot: {"op": "snapshot", "for": [HEX, ...], "version": V, "ready": true,
            "entries": {key: [version, writer, kind, data]}}: the answer to the requesters
            listed, published to all (merging it is harmless anywhere: the same rule); V is
            the sender's version (it holds every write up to V, and its entries are exactly
            those); empty entries when no requester is behind. "ready": false says the
            sender has not caught up itself yet (entries empty): ask someone else.
            A snapshot without "version" (an older sender) claims version 0.
`data` is JSON text for kind "json", base64 for "bytes", "" for "deleted".

Everything here comes from peers: `decode` checks every field and raises ConfigCodecError
(the replica logs and drops the message), never anything else.
"""

from __future__ import annotations

import base64
import binascii
import json
import json.scanner
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from episub.config.state import KINDS, MAX_KEY_LENGTH, Entry

__all__ = [
    "ConfigCodecError",
    "Snapshot",
    "SyncRequest",
    "Update",
    "decode",
    "encode_snapshot",
    "encode_sync",
    "encode_update",
    "entry_for",
    "value_of",
]

MAX_WRITER_ID = 64  # a node id's bound (episub.proto.wire.MAX_PEER_ID_SIZE)
# Sync requests one snapshot answers at most; guess: a burst of executors starting at once.
MAX_REQUESTERS = 64


class ConfigCodecError(ValueError):
    """A config message that is not well formed; it is dropped."""


@dataclass(frozen=True, slots=True)
class Update:
    version: int
    writer: bytes
    changes: dict[str, Entry]


@dataclass(frozen=True, slots=True)
class SyncRequest:
    requester: bytes
    responder: bytes
    version: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    requesters: tuple[bytes, ...]
    entries: dict[str, Entry]
    version: int = 0  # the sender's: it holds every write up to here
    ready: bool = True  # False: the sender has not caught up itself yet


def _data_out(entry: Entry) -> str:
    if entry.kind == "bytes":
        return base64.b64encode(entry.data).decode("ascii")
    return entry.data.decode()


def encode_update(version: int, writer: bytes, changes: Mapping[str, Entry]) -> bytes:
    body = {k: [e.kind, _data_out(e)] for k, e in changes.items()}
    return _dump({"op": "update", "version": version, "writer": writer.hex(), "set": body})


def encode_sync(requester: bytes, responder: bytes, version: int) -> bytes:
    return _dump({"op": "sync", "from": requester.hex(), "to": responder.hex(), "version": version})


def encode_snapshot(
    requesters: Sequence[bytes], entries: Mapping[str, Entry], version: int = 0, ready: bool = True
) -> bytes:
    body = {k: [e.version, e.writer.hex(), e.kind, _data_out(e)] for k, e in entries.items()}
    return _dump({"op": "snapshot", "for": [r.hex() for r in requesters], "version": version,
                  "ready": ready, "entries": body})  # fmt: skip


def _dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


# The json module's C scanner, called directly: one call per JSON text where json.loads
# makes a handful (an update reaches every replica of the deployment: the hot path).
_scan = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed's stub


def _json_value(text: str) -> object:
    """`text` as JSON, as json.loads reads it; ValueError if it is not JSON."""
    try:
        value, end = _scan(text, 0)
    except (StopIteration, ValueError):
        value, end = None, -1
    if end != len(text):  # whitespace around it, or not JSON: json.loads decides
        return json.loads(text)
    return value


def decode(raw: bytes) -> Update | SyncRequest | Snapshot:
    try:
        obj = _json_value(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigCodecError(f"not JSON: {exc}") from None
    if type(obj) is not dict:
        raise ConfigCodecError(f"not a JSON object but {type(obj).__name__}")
    op = obj.get("op")
    if op == "update":
        version, writer = _version(obj.get("version")), _node_id(obj.get("writer"))
        return Update(version, writer, _update_entries(obj.get("set"), version, writer))
    if op == "sync":
        return SyncRequest(
            _node_id(obj.get("from")), _node_id(obj.get("to")), _version(obj.get("version"), 0)
        )
    if op == "snapshot":
        entries = {}
        for key, value in _mapping(obj.get("entries"), "entries").items():
            if not isinstance(value, list) or len(value) != 4:
                raise ConfigCodecError(
                    f"a snapshot entry is [version, writer, kind, data], not {value!r:.80}"
                )
            version, writer, kind, data = value
            entries[_key(key)] = _entry(_version(version), _node_id(writer), kind, data)
        requesters = obj.get("for")
        if not isinstance(requesters, list) or len(requesters) > MAX_REQUESTERS:
            raise ConfigCodecError(f"'for' must list at most {MAX_REQUESTERS} node ids")
        ready = obj.get("ready", True)
        if type(ready) is not bool:
            raise ConfigCodecError(f"'ready' must be true or false, not {ready!r:.40}")
        version = _version(obj.get("version", 0), 0)
        return Snapshot(tuple(map(_node_id, requesters)), entries, version, ready)
    raise ConfigCodecError(f"unknown op {op!r:.40}")


def _update_entries(changes: object, version: int, writer: bytes) -> dict[str, Entry]:
    """An update's "set", checked: each key's [kind, data] as an entry stamped (version,
    writer). A JSON value (the usual kind) is checked by one scanner call, in line."""
    entries = {}
    for key, value in _mapping(changes, "set").items():
        if not 1 <= len(key) <= MAX_KEY_LENGTH:
            _key(key)  # raises
        if type(value) is list and len(value) == 2 and value[0] == "json":
            data = value[1]
            if type(data) is str:
                try:
                    end = _scan(data, 0)[1]
                except (StopIteration, ValueError):
                    end = -1
                if end == len(data):
                    entries[key] = Entry.checked(version, writer, "json", data.encode())
                    continue
        entries[key] = _entry(version, writer, *_pair(value))
    return entries


def _mapping(value: object, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigCodecError(f"{name!r} must be an object, not {type(value).__name__}")
    return value


def _pair(value: object) -> tuple[object, object]:
    if not isinstance(value, list) or len(value) != 2:
        raise ConfigCodecError(f"an update's value is [kind, data], not {value!r:.80}")
    return value[0], value[1]


def _version(value: object, least: int = 1) -> int:
    if type(value) is not int or not least <= value < 2**63:
        raise ConfigCodecError(f"a version must be an int in {least}..2**63-1, not {value!r:.40}")
    return value


def _node_id(value: object) -> bytes:
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else None
    except ValueError:
        raw = None
    if raw is None or not 1 <= len(raw) <= MAX_WRITER_ID:
        raise ConfigCodecError(f"a node id is 1..{MAX_WRITER_ID} bytes in hex, not {value!r:.80}")
    return raw


def _key(key: str) -> str:
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise ConfigCodecError(f"a key must be 1..{MAX_KEY_LENGTH} chars, not {key!r:.80}")
    return key


def _entry(version: int, writer: bytes, kind: object, data: object) -> Entry:
    if kind not in KINDS or not isinstance(data, str):
        raise ConfigCodecError(
            f"an entry's kind is one of {KINDS} and its data a str, not {kind!r:.20}"
        )
    if kind == "deleted":
        if data:
            raise ConfigCodecError("a deleted entry carries no data")
        raw = b""
    elif kind == "bytes":
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigCodecError("a bytes entry's data is not base64") from None
    else:
        try:
            _json_value(data)
        except json.JSONDecodeError:
            raise ConfigCodecError("a json entry's data is not JSON") from None
        raw = data.encode()
    return Entry(version, writer, kind, raw)  # type: ignore[arg-type]


def entry_for(value: object, version: int, writer: bytes) -> Entry:
    """An application's value as an entry: bytes stay bytes, anything else must be JSON
    (no NaN or infinity, which other JSON readers refuse)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return Entry(version, writer, "bytes", bytes(value))
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"a config value must be bytes or JSON-serialisable, not {type(value).__name__}: {exc}"
        ) from None
    return Entry(version, writer, "json", text.encode())


def value_of(entry: Entry) -> object:
    """The application's value an entry holds (None for a deleted one)."""
    if entry.kind == "bytes":
        return entry.data
    if entry.kind == "json":
        return json.loads(entry.data)
    return None
