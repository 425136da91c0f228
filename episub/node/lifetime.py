"""A node's lifetime: listen, start the runtime (episub.net) in a nursery, and on leaving
leave every topic (LEAVE is sent and flushed within `CLOSE_TIMEOUT`) and close every
connection. A node's id is `b"host:port/<random tag>"`, new on every start."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from episub.net.peer_id import Address, format_address, make_peer_id
from episub.net.runtime import Runtime
from episub.proto.signing import Signer

__all__ = ["CLOSE_TIMEOUT", "open_listeners", "running"]

# Leaving on exit: LEAVE out, flushed, EOFs exchanged. One RTT when all is well.
CLOSE_TIMEOUT = 2.0  # guess: covers a slow WAN round trip or two; exit stays prompt


@asynccontextmanager
async def running(
    *,
    listen: Address,
    advertise: str,
    sign: bool,
    make_runtime: Callable[[bytes, Signer | None], Runtime],
    on_stop: Callable[[], None],
) -> AsyncIterator[tuple[Runtime, trio.Nursery, str]]:
    """The runtime, the nursery its tasks run in, and the "host:port" peers dial, while
    in the block; `on_stop` is called once the runtime has shut down."""
    # The body's exception is re-raised outside the nursery, so that the caller sees it
    # as raised, not wrapped in an ExceptionGroup by the nursery.
    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        listeners = await open_listeners(listen)
        port = listeners[0].socket.getsockname()[1]
        signer = Signer.generate() if sign else None
        tag = None if signer is None else signer.tag.decode("ascii")
        my_id = make_peer_id(advertise, port, tag)
        address = format_address(advertise, port)
        runtime = make_runtime(my_id, signer)
        await nursery.start(runtime.run, listeners)
        try:
            yield runtime, nursery, address
        except BaseException as exc:
            body_error = exc
        finally:
            await runtime.shutdown(CLOSE_TIMEOUT)
            on_stop()
            nursery.cancel_scope.cancel()
    if body_error is not None:
        raise body_error


async def open_listeners(listen: Address) -> list[trio.SocketListener]:
    host, port = listen.host, listen.port
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot listen on {listen}: {exc.strerror}") from exc
    ports = {listener.socket.getsockname()[1] for listener in listeners}
    if len(ports) > 1:
        for listener in listeners:
            await listener.aclose()
        raise ValueError(
            f"{host!r} resolves to several addresses that got different free ports; "
            "listen on one IP address, or give a port"
        )
    return listeners
