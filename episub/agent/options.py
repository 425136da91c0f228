"""What the `episub` subcommands read besides their arguments: the key, a config file, a
link-delay file. Each loader raises `UsageError` with one line naming the bad value.

- Key: `--key-file PATH` (32 raw bytes, or 64 hex characters with optional whitespace
  around them), else the environment variable EPISUB_KEY (64 hex characters). The key is
  the deployment's shared secret, so it is never taken from the command line, where any
  local user could read it in the process list.
- Config (`--config FILE`): JSON overrides of NodeConfig, e.g.
  {"membership": {"c_near": 2, "ping_interval": 0.5}, "broadcast": {"ihave_interval": 0.05},
  "max_topics": 16}, and of the node's RetentionConfig under "retention", e.g.
  {"retention": {"max_age": 3600}}. Unknown names are refused, so a typo does not go
  unnoticed.
- Link delay (`--link-delay FILE`): {"zones": {"127.0.0.1:7001": "a", ...}, "intra_ms": 1,
  "inter_ms": 30}, for zones_link_delay (emulated latency on one machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from episub.net.link_delay import LinkDelay, zones_link_delay
from episub.net.peer_id import PeerIdError, parse_address
from episub.proto.config import BroadcastConfig, MembershipConfig, NodeConfig
from episub.proto.messages import check_topic_name
from episub.proto.store import RetentionConfig

__all__ = [
    "KEY_ENV",
    "UsageError",
    "check_addresses",
    "load_config",
    "load_key",
    "load_link_delay",
    "load_retention",
    "number_type",
    "topic_name",
]

KEY_ENV = "EPISUB_KEY"
KEY_SIZE = 32  # the handshake's key (episub.net.handshake): blake3's keyed mode takes 32 bytes
_MAX_FILE_SIZE = 1024 * 1024  # config files are small; a bigger one is the wrong file


class UsageError(Exception):
    """The user gave something unusable; the message is the one line they see."""


def _hex_key(text: str, where: str) -> bytes:
    text = text.strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_SIZE or len(text) != 2 * KEY_SIZE:
        shown = f"{len(text)} characters" if len(text) != 2 * KEY_SIZE else "non-hex characters"
        raise UsageError(
            f"{where} must be {2 * KEY_SIZE} hex characters (a {KEY_SIZE}-byte key), got {shown}"
        )
    return key


def load_key(key_file: str | None, environ: Mapping[str, str] | None = None) -> bytes:
    """The deployment key from `key_file`, else from EPISUB_KEY."""
    environ = os.environ if environ is None else environ
    if key_file is not None:
        try:
            data = Path(key_file).read_bytes()[: 4 * KEY_SIZE + 1]
        except OSError as exc:
            raise UsageError(f"cannot read key file {key_file!r}: {exc.strerror}") from None
        if len(data) == KEY_SIZE:
            return data
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError:
            text = ""
        if len(text.strip()) != 2 * KEY_SIZE:
            raise UsageError(
                f"key file {key_file!r} holds {len(data)} bytes: expected {KEY_SIZE} raw bytes "
                f"or {2 * KEY_SIZE} hex characters"
            )
        return _hex_key(text, f"key file {key_file!r}")
    from_env = environ.get(KEY_ENV)
    if from_env is None:
        raise UsageError(
            f"no key: give --key-file PATH or set {KEY_ENV} to {2 * KEY_SIZE} hex characters "
            f"(the deployment's shared {KEY_SIZE}-byte key)"
        )
    return _hex_key(from_env, KEY_ENV)


def _read_json(path: str, what: str) -> Any:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_FILE_SIZE + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path!r}: {exc.strerror}") from None
    if len(data) > _MAX_FILE_SIZE:
        raise UsageError(f"{what} {path!r} is over {_MAX_FILE_SIZE} bytes: not a {what}")
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{what} {path!r} is not valid JSON: {exc}") from None


RETENTION_SECTION = "retention"  # the config file's RetentionConfig overrides
# Broadcast settings of a topic's message cache, now the node's message store's.
_MOVED_TO_RETENTION = {
    "cache_ttl": "max_age",
    "cache_max_messages": "max_messages",
    "cache_max_bytes": "max_bytes",
    "seen_ttl": "seen_ttl",
    "seen_max": "seen_max",
}


def _fields(cls: type, values: object, where: str) -> dict[str, Any]:
    if not isinstance(values, dict):
        raise UsageError(f"{where} must be a JSON object, not {values!r:.80}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown and unknown[0] in _MOVED_TO_RETENTION:
        moved = _MOVED_TO_RETENTION[unknown[0]]
        raise UsageError(
            f"{where}: {unknown[0]!r} is now the {RETENTION_SECTION!r} section's {moved!r} "
            "(one message store per node holds what a topic's cache held)"
        )
    if unknown:
        raise UsageError(
            f"{where}: unknown setting {unknown[0]!r}; known ones: {', '.join(sorted(known))}"
        )
    return values


def load_config(path: str | None) -> NodeConfig:
    """NodeConfig() with the file's overrides; the defaults when `path` is None."""
    if path is None:
        return NodeConfig()
    data = _read_json(path, "config file")
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k != RETENTION_SECTION}  # load_retention's
    data = _fields(NodeConfig, data, f"config file {path!r}")
    if "id_key" in data:
        raise UsageError(f"config file {path!r}: id_key is a secret; it is not read from a config")
    try:
        membership = MembershipConfig(
            **_fields(MembershipConfig, data.pop("membership", {}), f"{path}: membership")
        )
        broadcast = BroadcastConfig(
            **_fields(BroadcastConfig, data.pop("broadcast", {}), f"{path}: broadcast")
        )
        return NodeConfig(membership=membership, broadcast=broadcast, **data)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"config file {path!r}: {exc}") from None


def load_retention(path: str | None) -> RetentionConfig:
    """RetentionConfig() with the config file's "retention" overrides (defaults if none)."""
    if path is None:
        return RetentionConfig()
    data = _read_json(path, "config file")
    where = f"config file {path!r}: {RETENTION_SECTION}"
    if not isinstance(data, dict):
        raise UsageError(f"config file {path!r} must be a JSON object, not {data!r:.80}")
    values = _fields(RetentionConfig, data.get(RETENTION_SECTION, {}), where)
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UsageError(f"{where}: {name} must be a number, not {value!r:.40}")
    try:
        return RetentionConfig(**values)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{where}: {exc}") from None


def load_link_delay(path: str | None) -> LinkDelay | None:
    if path is None:
        return None
    data = _read_json(path, "link-delay file")
    where = f"link-delay file {path!r}"
    if not isinstance(data, dict) or set(data) - {"zones", "intra_ms", "inter_ms"}:
        raise UsageError(
            f'{where} must be {{"zones": {{"host:port": "zone", ...}}, "intra_ms": N, '
            f'"inter_ms": N}}, not {data!r:.80}'
        )
    zones = data.get("zones", {})
    if not isinstance(zones, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in zones.items()
    ):
        raise UsageError(f'{where}: "zones" must map "host:port" to a zone name')
    delays = []
    for name in ("intra_ms", "inter_ms"):
        value = data.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise UsageError(f"{where}: {name} must be a number >= 0, not {value!r}")
        delays.append(value / 1000.0)
    return zones_link_delay(dict(zones), delays[0], delays[1])


def number_type(kind: type, low: float, *, above: bool = False) -> Any:
    """An argparse type: `kind(text)` that is >= low (> low with `above`), else one line."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if value < low or (above and value == low):
            raise argparse.ArgumentTypeError(f"must be {'>' if above else '>='} {low}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def topic_name(text: str) -> str:
    """An argparse type: a topic name (check_topic_name), else one line and status 2."""
    try:
        check_topic_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def check_addresses(listen: str, bootstrap: list[str]) -> None:
    """Refuse a malformed --listen or --bootstrap before anything starts."""
    try:
        parse_address(listen, allow_port_zero=True)
    except PeerIdError as exc:
        raise UsageError(f"--listen: {exc}") from None
    for address in bootstrap:
        try:
            parse_address(address)
        except PeerIdError as exc:
            raise UsageError(f"--bootstrap: {exc}") from None
