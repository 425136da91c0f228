"""Where an executor's node listens: on this host's address toward the driver, since an
executor on another host cannot bind the driver's address (no Spark needed here)."""

from __future__ import annotations

import socket

import pytest

from spark_connector.deployment import local_address_toward


def test_toward_loopback_the_address_is_loopback() -> None:
    assert local_address_toward("127.0.0.1") == "127.0.0.1"


def test_the_chosen_address_can_be_bound() -> None:
    address = local_address_toward("127.0.0.1")
    with socket.socket() as listener:
        listener.bind((address, 0))  # would raise if the address were not this host's
        assert listener.getsockname()[0] == address


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 in this Python")
def test_toward_ipv6_loopback_the_address_is_ipv6_loopback() -> None:
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 sockets on this machine")
    assert local_address_toward("::1") == "::1"


def test_an_unresolvable_host_falls_back_to_itself() -> None:
    assert local_address_toward("no-such-host.invalid") == "no-such-host.invalid"
