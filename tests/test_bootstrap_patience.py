"""bootstrap.patiently: a join whose bootstrap addresses do not answer yet is tried again
with backoff up to a bound; one refused by an answering peer is not. Time is trio's
MockClock, stepped by the sleeps themselves."""

from __future__ import annotations

import itertools

import pytest
import trio
import trio.testing

from episub.net.handshake import HandshakeError
from episub.node.bootstrap import BootstrapError, patiently


def _run(attempt, within: float) -> tuple[object, list[float]]:  # type: ignore[no-untyped-def]
    waits: list[float] = []

    async def main() -> object:
        return await patiently(attempt, within, lambda _error, left: waits.append(left))

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)), waits


def test_a_join_is_tried_again_until_an_address_answers() -> None:
    tries: list[float] = []

    async def attempt() -> str:
        tries.append(trio.current_time())
        if len(tries) < 4:
            raise BootstrapError({"127.0.0.1:7000": ConnectionRefusedError("refused")})
        return "joined"

    result, waits = _run(attempt, 30.0)
    assert result == "joined"
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(tries)]
    assert gaps == [0.1, 0.2, 0.4]  # backoff doubles
    assert len(waits) == 3


def test_the_last_error_is_raised_when_the_bound_is_spent() -> None:
    async def attempt() -> None:
        raise BootstrapError({"127.0.0.1:7000": ConnectionRefusedError("refused")})

    with pytest.raises(BootstrapError, match=r"127\.0\.0\.1:7000"):
        _run(attempt, 5.0)


def test_a_peer_that_answers_and_refuses_the_handshake_fails_at_once() -> None:
    tries = []

    async def attempt() -> None:
        tries.append(1)
        raise BootstrapError({"127.0.0.1:7000": HandshakeError("wrong key", reason="wrong_key")})

    with pytest.raises(BootstrapError, match="wrong key"):
        _run(attempt, 30.0)
    assert len(tries) == 1


def test_no_bound_means_one_try() -> None:
    tries = []

    async def attempt() -> None:
        tries.append(1)
        raise BootstrapError({"127.0.0.1:7000": ConnectionRefusedError("refused")})

    with pytest.raises(BootstrapError):
        _run(attempt, 0.0)
    assert len(tries) == 1
