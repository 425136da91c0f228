"""Peer ids carry their address (b"host:port/tag"); link delays are looked up by address."""

from __future__ import annotations

import pytest

from episub.net.link_delay import zones_link_delay
from episub.net.peer_id import (
    Address,
    PeerIdError,
    make_peer_id,
    parse_address,
    parse_peer_id,
)


def test_an_id_carries_the_address_it_was_made_for() -> None:
    peer_id = make_peer_id("127.0.0.1", 7000, tag="0123456789abcdef")
    assert peer_id == b"127.0.0.1:7000/0123456789abcdef"
    assert parse_peer_id(peer_id) == Address("127.0.0.1", 7000)


def test_two_ids_for_one_address_differ() -> None:
    assert make_peer_id("10.0.0.1", 1) != make_peer_id("10.0.0.1", 1)


def test_ipv6_hosts_are_bracketed() -> None:
    peer_id = make_peer_id("::1", 7000, tag="00" * 8)
    assert peer_id == b"[::1]:7000/0000000000000000"
    assert parse_peer_id(peer_id) == Address("::1", 7000)
    assert str(Address("::1", 7000)) == "[::1]:7000"


def test_host_names_are_allowed() -> None:
    assert parse_peer_id(make_peer_id("node-3.example", 9)) == Address("node-3.example", 9)


@pytest.mark.parametrize(
    ("bad", "shown"),
    [
        (b"127.0.0.1:7000", "host:port/tag"),
        (b"127.0.0.1:7000/xyz", "16 or 32 lowercase hex"),
        (b"127.0.0.1:7000/0123456789ABCDEF", "16 or 32 lowercase hex"),
        (b"127.0.0.1/0123456789abcdef", "host:port"),
        (b"127.0.0.1:0/0123456789abcdef", "1..65535"),
        (b"127.0.0.1:70000/0123456789abcdef", "1..65535"),
        (b"::1:7000/0123456789abcdef", "brackets"),
        (b"\xff:1/0123456789abcdef", "not ASCII"),
        (b"x" * 65, "1..64 bytes"),
        ("127.0.0.1:1/0123456789abcdef", "must be bytes"),
    ],
)
def test_malformed_ids_are_refused_showing_the_bad_value(bad: object, shown: str) -> None:
    with pytest.raises(PeerIdError, match=shown):
        parse_peer_id(bad)


def test_an_id_longer_than_the_wire_allows_is_refused() -> None:
    with pytest.raises(PeerIdError, match="more than 64"):
        make_peer_id("a-very-long-host-name-that-goes-on.example.com", 65535)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("127.0.0.1", "host:port"),
        ("127.0.0.1:x", "number"),
        (":7000", "empty host"),
        ("[127.0.0.1]:7000", "IPv6 hosts only"),
        ("a b:7000", "not a host name"),
    ],
)
def test_bad_addresses_say_what_is_wrong(text: str, error: str) -> None:
    with pytest.raises(PeerIdError, match=error):
        parse_address(text)


def test_port_zero_only_where_allowed() -> None:
    assert parse_address("127.0.0.1:0", allow_port_zero=True).port == 0
    with pytest.raises(PeerIdError, match=r"1\.\.65535"):
        parse_address("127.0.0.1:0")


def test_zones_link_delay_is_intra_inside_a_zone_and_inter_across() -> None:
    zones = {"10.0.0.1:1": "eu", "10.0.0.2:1": "eu", "10.0.0.3:1": "us"}
    delay = zones_link_delay(zones, intra=0.001, inter=0.05)
    a, b, c = (make_peer_id(f"10.0.0.{i}", 1) for i in (1, 2, 3))
    assert delay(a, b) == 0.001
    assert delay(a, c) == 0.05
    assert delay(c, a) == 0.05


def test_zones_link_delay_treats_an_unknown_address_as_far_and_reads_the_map_late() -> None:
    zones: dict[str, str] = {}
    delay = zones_link_delay(zones, intra=0.001, inter=0.05)
    a, b = make_peer_id("10.0.0.1", 1), make_peer_id("10.0.0.2", 1)
    assert delay(a, b) == 0.05
    zones.update({"10.0.0.1:1": "eu", "10.0.0.2:1": "eu"})
    assert delay(a, b) == 0.001
    assert delay(a, b"not an id") == 0.05


def test_zones_link_delay_refuses_negative_delays() -> None:
    with pytest.raises(ValueError, match="intra must be >= 0 seconds, not -1"):
        zones_link_delay({}, intra=-1, inter=0.1)
