"""Peer ids that carry their address: `b"<host>:<port>/<16 hex chars>"`.

The core passes peer ids around in NODES, SHUFFLE, FORWARDJOIN and friends, and never
addresses. Putting the listening address inside the id means any node that learns an id
can dial it, with no address book to keep in sync. The random tag makes the id unique to
one run of a process: a node restarted on the same address is a new peer, which it must
be, because its publisher sequence numbers start again at 0. A node that signs its
messages (episub/proto/signing.py) carries a 32-hex-character tag derived from its
signing key instead of 16 random ones: the key is new on every start, and so is the tag.

IPv6 hosts are written in brackets (`[::1]:7000/...`), as in URLs. Ids are at most
`MAX_PEER_ID_SIZE` (64) bytes, the wire's bound, which leaves 41 characters for the host
(25 with a signing node's longer tag).
"""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass

from episub.proto.signing import BOUND_TAG_HEX_CHARS
from episub.proto.wire import MAX_PEER_ID_SIZE

__all__ = [
    "TAG_HEX_CHARS",
    "Address",
    "PeerIdError",
    "format_address",
    "make_peer_id",
    "parse_address",
    "parse_peer_id",
]

TAG_HEX_CHARS = 16  # 64 random bits: two runs of one address never collide in practice
_TAG_SIZES = (TAG_HEX_CHARS, BOUND_TAG_HEX_CHARS)  # random, or a signing key's (signing.py)
_HEX = frozenset("0123456789abcdef")
# Characters a host name may not contain: the id's separators, and anything a resolver
# would not take anyway.
_FORBIDDEN_IN_HOST = frozenset("/[]@ \t\r\n")


class PeerIdError(ValueError):
    """A peer id or an address that does not parse; the message shows the bad value."""


@dataclass(frozen=True, slots=True)
class Address:
    """Where a peer listens: what `trio.open_tcp_stream(host, port)` takes."""

    host: str
    port: int

    def __str__(self) -> str:
        return format_address(self.host, self.port)


def _check_host(host: object, shown: object) -> str:
    if not isinstance(host, str):
        raise PeerIdError(f"host must be str, not {host!r}")
    if not host:
        raise PeerIdError(f"empty host in {shown!r}")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise PeerIdError(f"host {host!r} in {shown!r} is not an IPv6 address") from None
        return host
    if any(c in _FORBIDDEN_IN_HOST for c in host) or not host.isascii():
        raise PeerIdError(f"host {host!r} in {shown!r} is not a host name or IP address")
    return host


def _check_port(port: object, shown: object, *, allow_zero: bool = False) -> int:
    if isinstance(port, str):
        if not port.isdigit():
            raise PeerIdError(f"port must be a number, not {port!r} in {shown!r}")
        port = int(port)
    if not isinstance(port, int) or isinstance(port, bool):
        raise PeerIdError(f"port must be int, not {port!r}")
    low = 0 if allow_zero else 1
    if not low <= port <= 65535:
        raise PeerIdError(f"port must be in {low}..65535, not {port!r} in {shown!r}")
    return port


def format_address(host: str, port: int) -> str:
    """`host:port`, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(text: str, *, allow_port_zero: bool = False) -> Address:
    """`"host:port"` or `"[v6]:port"` to an Address; port 0 only if `allow_port_zero`
    (a listen address asking the OS for a free port)."""
    if not isinstance(text, str):
        raise PeerIdError(f"address must be a str like '127.0.0.1:7000', not {text!r}")
    host, sep, port = text.rpartition(":")
    if not sep:
        raise PeerIdError(f"address must be 'host:port', not {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            raise PeerIdError(f"brackets are for IPv6 hosts only, not {text!r}")
    elif ":" in host:
        raise PeerIdError(f"an IPv6 host needs brackets ('[::1]:7000'), not {text!r}")
    return Address(_check_host(host, text), _check_port(port, text, allow_zero=allow_port_zero))


def make_peer_id(host: str, port: int, tag: str | None = None) -> bytes:
    """A new peer id for a node listening at host:port; `tag` defaults to fresh randomness
    (a signing node passes its `Signer.tag`)."""
    _check_host(host, host)
    _check_port(port, port)
    if tag is None:
        tag = secrets.token_hex(TAG_HEX_CHARS // 2)
    if len(tag) not in _TAG_SIZES or not set(tag) <= _HEX:
        raise PeerIdError(
            f"tag must be {TAG_HEX_CHARS} or {BOUND_TAG_HEX_CHARS} lowercase hex characters, "
            f"not {tag!r}"
        )
    peer_id = f"{format_address(host, port)}/{tag}".encode("ascii")
    if len(peer_id) > MAX_PEER_ID_SIZE:
        raise PeerIdError(
            f"peer id {peer_id!r} is {len(peer_id)} bytes, more than {MAX_PEER_ID_SIZE}: "
            "use a shorter host name or an IP address"
        )
    return peer_id


def parse_peer_id(peer_id: object) -> Address:
    """The address inside a peer id; PeerIdError if it is not one of ours."""
    if not isinstance(peer_id, bytes):
        raise PeerIdError(f"peer id must be bytes, not {peer_id!r}")
    if not 0 < len(peer_id) <= MAX_PEER_ID_SIZE:
        raise PeerIdError(f"peer id must be 1..{MAX_PEER_ID_SIZE} bytes, not {len(peer_id)}")
    try:
        text = peer_id.decode("ascii")
    except UnicodeDecodeError:
        raise PeerIdError(f"peer id is not ASCII: {peer_id!r}") from None
    address, sep, tag = text.rpartition("/")
    if not sep:
        raise PeerIdError(f"peer id must be 'host:port/tag', not {peer_id!r}")
    if len(tag) not in _TAG_SIZES or not set(tag) <= _HEX:
        raise PeerIdError(
            f"peer id tag must be {TAG_HEX_CHARS} or {BOUND_TAG_HEX_CHARS} lowercase hex "
            f"characters: {peer_id!r}"
        )
    try:
        return parse_address(address)
    except PeerIdError as exc:
        raise PeerIdError(f"bad address in peer id {peer_id!r}: {exc}") from None
