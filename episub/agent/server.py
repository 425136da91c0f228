"""The agent's socket: one `AgentService` (a running `Node`) served over a Unix socket.

A Spark executor's Python workers come and go (docs/how-it-works.md, "Why an agent"), so the node
lives in a process of its own and the workers talk to it through a socket file. Each
client connection carries length-prefixed `Request`s with ids (agent.proto, wire.py);
every request runs in a task of its own, so one connection can have several in flight, and
a subscription streams its items back under its request's id until it is ended.

What a client controls is bounded (`AgentLimits`): frame size, requests in flight,
subscriptions, subscription buffers, clients (and, in service.py, records per batch and
bootstrap addresses). A request the agent cannot carry out gets an `Error` reply saying
why; a frame that cannot be decoded closes that client's connection only (the stream
cannot be resynchronised after it). A client over `max_clients` gets an Error with id 0,
then the connection closes.

The socket file is created mode 0600 (whoever can connect may publish without the key) and
removed on exit, unless another agent has replaced it since.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from typing import Any

import trio

from episub.agent import agent_pb2 as pb
from episub.agent.errors import (
    AgentAtLimit,
    AgentBadRequest,
    AgentBootstrapFailed,
    AgentError,
    AgentInternalError,
    AgentTooLarge,
)
from episub.agent.lifetime import WATCH_INTERVAL, OwnerProcess, lock_path_for, try_lock
from episub.agent.service import AgentService
from episub.agent.wire import FrameError, FrameSplitter, decode_request, encode_frame, item_to_pb
from episub.node import SUBSCRIPTION_BUFFER, BootstrapError
from episub.proto.errors import LocalProtocolError, MessageTooLarge
from episub.proto.messages import check_topic_name

__all__ = ["AgentServer"]

log = logging.getLogger("episub.agent")

RECEIVE_CHUNK = 1 << 20  # bytes read at a time: record batches come in ~1 MiB requests
# A reply the client does not read within this long ends its connection. Guess: a client
# that reads nothing for a minute is hung or gone (Spark kills idle workers after ~60 s).
SEND_TIMEOUT = 60.0
LISTEN_BACKLOG = 64  # = AgentLimits.max_clients: connects queue while the agent accepts
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes on Linux, NUL included


class _Client:
    def __init__(self, number: int, stream: trio.SocketStream, nursery: trio.Nursery) -> None:
        self.number = number
        self.stream = stream
        self.nursery = nursery
        self.send_lock = trio.Lock()
        self.in_flight: set[int] = set()
        self.subscriptions: dict[int, trio.CancelScope] = {}
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.nursery.cancel_scope.cancel()

    async def send(self, response: pb.Response) -> None:
        """Send a whole frame or none: a cancelled send_all would leave half a frame in the
        stream, so sends are shielded and bounded by SEND_TIMEOUT instead."""
        if self.closed:
            return
        data = encode_frame(response)
        # Not `async with send_lock`: its acquire yields a whole scheduler turn even when
        # the lock is free, and every ready task (a peer's reads and writes) runs first.
        try:
            self.send_lock.acquire_nowait()
        except trio.WouldBlock:
            await self.send_lock.acquire()
        try:
            with trio.CancelScope(shield=True), trio.move_on_after(SEND_TIMEOUT) as timer:
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self.close()
            if timer.cancelled_caught:
                log.warning(
                    "client %d read nothing for %s s; closing it", self.number, SEND_TIMEOUT
                )
                self.close()
        finally:
            self.send_lock.release()


def _error(request_id: int, kind: str, message: str) -> pb.Response:
    return pb.Response(id=request_id, error=pb.Error(kind=kind, message=message))


class AgentServer:
    """Serves `service` to clients of the Unix socket at `socket_path`; see the module doc."""

    def __init__(self, service: AgentService, socket_path: str) -> None:
        self.service = service
        self.limits = service.limits
        self.socket_path = socket_path
        self._socket_inode: tuple[int, int] | None = None
        self._clients: dict[int, _Client] = {}
        self._client_numbers = 0
        self._last_activity = trio.current_time()
        self.counters = dict.fromkeys(
            ("requests", "request_errors", "malformed_frames", "rejected_clients"), 0
        )

    # -- running ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; reports started once the socket accepts connections."""
        listener = await self._bind(self.socket_path)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(trio.serve_listeners, self._serve_client, [listener])
                task_status.started()
        finally:
            self.remove_socket()

    async def _bind(self, path: str) -> trio.SocketListener:
        if len(os.fsencode(path)) > _SUN_PATH_MAX:
            raise ValueError(
                f"socket path {path!r} is {len(os.fsencode(path))} bytes, "
                f"more than a Unix socket takes ({_SUN_PATH_MAX}); use a shorter path"
            )
        if os.path.exists(path):
            if not stat.S_ISSOCK(os.stat(path).st_mode):
                raise ValueError(f"{path!r} exists and is not a socket; not replacing it")
            if _answers(path):  # blocks the loop up to a second, once, before serving
                raise OSError(f"an agent already serves {path!r}")
            os.unlink(path)  # stale: its agent died without removing it
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        try:
            # bind() creates the file with the umask's bits; narrowed before anyone can
            # connect (listen() comes after): whoever connects may publish without the key.
            await sock.bind(path)
            os.chmod(path, 0o600)
            sock.listen(LISTEN_BACKLOG)
        except BaseException:
            sock.close()
            raise
        info = os.stat(path)
        self._socket_inode = (info.st_dev, info.st_ino)
        return trio.SocketListener(sock)

    def remove_socket(self) -> None:
        """Unlink our socket file, unless another agent has replaced it since."""
        inode, self._socket_inode = self._socket_inode, None
        if inode is None:
            return  # never bound, or removed already
        with contextlib.suppress(FileNotFoundError):
            info = os.stat(self.socket_path)
            if (info.st_dev, info.st_ino) == inode:
                os.unlink(self.socket_path)

    async def wait_retired(self, *, idle_timeout: float | None, owner: OwnerProcess | None) -> str:
        """Return (with the reason) once the owner is gone or the agent has been idle,
        without clients or requests, for `idle_timeout` seconds."""
        if idle_timeout is None and owner is None:
            # Nothing to watch: no wakeup every WATCH_INTERVAL for it (an idle node's CPU is
            # its wakeups); the agent stops on a signal.
            await trio.sleep_forever()
        interval = WATCH_INTERVAL if idle_timeout is None else min(WATCH_INTERVAL, idle_timeout / 4)
        while True:
            await trio.sleep(interval)
            if owner is not None and not owner.alive():
                return f"owner process {owner.pid} is gone"
            if idle_timeout is None or self._clients:
                continue
            idle = trio.current_time() - self._last_activity
            if idle < idle_timeout:
                continue
            with try_lock(lock_path_for(self.socket_path)) as locked:
                # A launcher holding the lock is about to attach: stay for it.
                if locked and not self._clients:
                    self.remove_socket()
                    return f"idle for {idle:.1f} s"

    def _touch(self) -> None:
        self._last_activity = trio.current_time()

    # -- clients ----------------------------------------------------------------------------

    async def _serve_client(self, stream: trio.SocketStream) -> None:
        self._touch()
        self._client_numbers += 1
        number = self._client_numbers
        try:
            if len(self._clients) >= self.limits.max_clients:
                await self._refuse(number, stream)
                return
            async with trio.open_nursery() as nursery:
                client = _Client(number, stream, nursery)
                self._clients[number] = client
                try:
                    reason = await self._read_requests(client)
                    log.debug("client %d: %s", number, reason)
                finally:
                    # The client is gone, or the agent is closing: end its requests and
                    # subscriptions, and wake a send stuck on a client that stopped reading.
                    client.close()
                    stream.socket.close()
        except Exception:  # a bug met by one client must not end the agent and its node
            log.exception("client %d: unexpected error; its connection is closed", number)
        finally:
            self._clients.pop(number, None)
            self._touch()
            await trio.aclose_forcefully(stream)

    async def _refuse(self, number: int, stream: trio.SocketStream) -> None:
        self.counters["rejected_clients"] += 1
        log.warning("refused client %d: %d clients already", number, len(self._clients))
        message = f"the agent serves at most {self.limits.max_clients} clients at once"
        # A courtesy, so the client learns why; bounded, as it may not read at all.
        with trio.move_on_after(1.0), contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(encode_frame(_error(0, AgentAtLimit.kind, message)))

    async def _read_requests(self, client: _Client) -> str:
        decoder = FrameSplitter(self.limits.max_request_size)
        while True:
            try:
                data = await client.stream.receive_some(RECEIVE_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                return f"connection lost ({exc!r})"
            if not data:
                return "closed the connection"
            decoder.feed(data)
            try:
                while (body := decoder.next_body()) is not None:
                    await self._dispatch(client, decode_request(body))
            except FrameError as exc:
                self.counters["malformed_frames"] += 1
                log.warning("client %d sent a malformed frame, closing it: %s", client.number, exc)
                return "malformed frame"

    async def _dispatch(self, client: _Client, request: pb.Request) -> None:
        """Start the request's task, or refuse it here (which also slows a flooding client)."""
        self._touch()
        self.counters["requests"] += 1
        rid, kind = request.id, request.WhichOneof("body")
        refusal = None
        if kind is None:
            refusal = AgentBadRequest.kind, "empty request: no known operation is set"
        elif rid in client.in_flight or rid in client.subscriptions:
            refusal = (
                AgentBadRequest.kind,
                f"request id {rid} is already in flight on this connection",
            )
        elif kind == "subscribe":
            refusal = self._check_subscribe(client, request.subscribe)
        elif len(client.in_flight) >= self.limits.max_in_flight:
            refusal = AgentAtLimit.kind, f"at most {self.limits.max_in_flight} requests in flight"
        if refusal is not None:
            self.counters["request_errors"] += 1
            await client.send(_error(rid, *refusal))
        elif kind == "inspect":
            # Answered here, from memory, without a task of its own: a task would first
            # wait a scheduler turn behind every ready task of the node (a peer's reads and
            # writes), and `inspect` is how an operator looks at a node under load.
            await self._inspect(client, rid)
        elif kind == "subscribe":
            client.subscriptions[rid] = trio.CancelScope()
            client.nursery.start_soon(self._subscription, client, rid, request.subscribe)
        else:
            client.in_flight.add(rid)
            client.nursery.start_soon(self._handle, client, rid, kind, getattr(request, kind))

    async def _handle(self, client: _Client, rid: int, kind: str, body: Any) -> None:
        try:
            response = await self._answer(client, rid, kind, body)
        except Exception as exc:  # a bug here must not take the agent (and its node) down
            response = self._failure(client, rid, kind, exc)
        finally:
            client.in_flight.discard(rid)
        await self._reply(client, response)

    async def _inspect(self, client: _Client, rid: int) -> None:
        try:
            response = pb.Response(id=rid, node_info=self._node_info())
        except Exception as exc:
            response = self._failure(client, rid, "inspect", exc)
        await self._reply(client, response)

    async def _reply(self, client: _Client, response: pb.Response) -> None:
        if response.WhichOneof("body") == "error":
            self.counters["request_errors"] += 1
        await client.send(response)

    def _failure(self, client: _Client, rid: int, kind: str, exc: Exception) -> pb.Response:
        """The Error reply for a request that raised `exc`, typed by its cause."""
        if isinstance(exc, AgentError):  # a refusal of the service's
            return _error(rid, exc.kind, str(exc))
        if isinstance(exc, MessageTooLarge):
            return _error(rid, AgentTooLarge.kind, str(exc))
        if isinstance(exc, BootstrapError):
            return _error(rid, AgentBootstrapFailed.kind, str(exc))
        if isinstance(exc, LocalProtocolError | ValueError | TypeError):
            return _error(rid, AgentBadRequest.kind, str(exc))
        log.exception("client %d: %s request %d failed", client.number, kind, rid, exc_info=exc)
        return _error(rid, AgentInternalError.kind, f"{type(exc).__name__}: {exc}")

    async def _answer(self, client: _Client, rid: int, kind: str, body: Any) -> pb.Response:
        service = self.service
        if kind == "join":
            await service.join_request(body)
        elif kind == "leave":
            await service.leave(body.topic)
        elif kind == "publish":
            return pb.Response(id=rid, published=await service.publish(body.topic, [body.record]))
        elif kind == "publish_batch":
            return pb.Response(id=rid, published=await service.publish(body.topic, body.records))
        elif kind == "unsubscribe":
            scope = client.subscriptions.get(body.subscribe_id)
            if scope is None:
                raise AgentBadRequest(f"no subscription {body.subscribe_id} on this connection")
            scope.cancel()
        elif kind == "read_range":
            return pb.Response(id=rid, messages=await service.read_range(body))
        elif kind == "offsets":
            return pb.Response(id=rid, offsets=service.offsets(body.topic))
        elif kind == "config_read":
            return pb.Response(id=rid, config=await service.config_read(body))
        elif kind == "config_write":
            return pb.Response(id=rid, config=await service.config_write(body))
        elif kind == "overlay":
            return pb.Response(id=rid, overlay_map=await self.service.overlay(body))
        elif kind == "holdings":
            return pb.Response(id=rid, holdings_map=await service.holdings(body))
        elif kind == "known_topics":
            return pb.Response(id=rid, topic_list=await service.known_topics(body))
        else:
            raise AgentBadRequest(f"unknown request {kind!r}")
        await trio.lowlevel.checkpoint()
        return pb.Response(id=rid, done=pb.Done())

    def _node_info(self) -> pb.NodeInfo:
        stats = {f"agent_{name}": value for name, value in self.counters.items()}
        stats["agent_clients"] = len(self._clients)
        return self.service.node_info(stats)

    # -- subscriptions ----------------------------------------------------------------------

    def _check_subscribe(self, client: _Client, body: pb.Subscribe) -> tuple[str, str] | None:
        try:
            check_topic_name(body.topic)
        except ValueError as exc:
            return AgentBadRequest.kind, str(exc)
        if body.buffer > self.limits.max_subscription_buffer:
            return AgentAtLimit.kind, (
                f"a subscription buffer holds at most {self.limits.max_subscription_buffer} "
                f"items, not {body.buffer}"
            )
        if len(client.subscriptions) >= self.limits.max_subscriptions:
            return (
                AgentAtLimit.kind,
                f"at most {self.limits.max_subscriptions} subscriptions per client",
            )
        return None

    async def _subscription(self, client: _Client, rid: int, body: pb.Subscribe) -> None:
        scope = client.subscriptions[rid]
        reason = "the agent is closing"
        try:
            with scope:
                async with self.service.node.subscribe(
                    body.topic, body.buffer or SUBSCRIPTION_BUFFER
                ) as sub:
                    await client.send(pb.Response(id=rid, done=pb.Done()))
                    async for item in sub:
                        reply = pb.Response(id=rid)
                        item_to_pb(item, reply.item)  # in place: the value is copied once
                        await client.send(reply)
            if scope.cancelled_caught:
                reason = "unsubscribed"
        except Exception as exc:  # as in _handle: the agent outlives a bug met here
            log.exception("client %d: subscription %d failed", client.number, rid)
            reason = f"failed: {type(exc).__name__}: {exc}"
        finally:
            del client.subscriptions[rid]
        await client.send(pb.Response(id=rid, end=pb.End(reason=reason)))


def _answers(path: str) -> bool:
    """Does something accept connections on the Unix socket at `path`?"""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True
