"""The node's argument checks: what a caller hands `Node` is checked here, once, with an
error that shows the bad value; the parts behind `Node` trust what passed."""

from __future__ import annotations

from collections.abc import Iterable

from episub.net.peer_id import format_address, parse_address
from episub.proto.envelope import Record

__all__ = [
    "FETCH_MAX_SPAN",
    "advertised_host",
    "as_records",
    "check_bootstrap",
    "check_fetch_range",
    "check_sign",
]

FETCH_MAX_SPAN = 1_000_000  # seqs one fetch may span: bounds the gap scan's work
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def check_sign(sign: object) -> bool:
    if not isinstance(sign, bool):
        raise TypeError(f"sign must be True or False, not {sign!r}")
    return sign


def advertised_host(listen: str, listen_host: str, advertise: str | None) -> str:
    """The host peers dial (and peer ids carry): `advertise`, else the listen host."""
    host = advertise if advertise is not None else listen_host
    if host in _WILDCARD_HOSTS:
        raise ValueError(
            f"listening on {listen!r} needs advertise= the host peers should dial "
            "(peer ids carry it)"
        )
    return parse_address(format_address(host, 1)).host


def check_bootstrap(bootstrap: Iterable[str]) -> None:
    if isinstance(bootstrap, str | bytes):
        raise TypeError(f"bootstrap must be a list of 'host:port' strings, not {bootstrap!r}")


def as_records(records: Iterable[Record | bytes]) -> list[Record]:
    """A publish_many batch as Records (a bare bytes value is a Record of that value)."""
    return [r if type(r) is Record else Record(r) for r in records]  # type: ignore[arg-type]


def check_fetch_range(first_seq: int, last_seq: int) -> None:
    if not 0 <= first_seq <= last_seq:
        raise ValueError(f"need 0 <= first_seq <= last_seq, not {first_seq!r}..{last_seq!r}")
    if last_seq - first_seq >= FETCH_MAX_SPAN:
        raise ValueError(
            f"a fetch spans at most {FETCH_MAX_SPAN} seqs, not {first_seq}..{last_seq}"
        )
