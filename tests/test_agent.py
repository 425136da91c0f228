"""The agent as ensure_agent starts it: real processes, a real Unix socket.

Start-or-attach (one agent per socket path, however many callers), its lifetime (the owner
process, the idle timeout), two client processes at once, and bad input from a client.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from episub.agent import AgentBadRequest, AgentClient, AgentError, AgentUnavailable, ensure_agent
from episub.agent import agent_pb2 as pb
from episub.agent.wire import FrameSplitter, decode_response, encode_frame
from tests.proc_helpers import (
    KEY,
    TOPIC,
    WAIT,
    Processes,
    is_alive,
    wait_process_gone,
)

pytestmark = pytest.mark.timeout(90)


def start_agent(processes: Processes, **kwargs: object) -> tuple[str, int]:
    """ensure_agent on a fresh socket path; the agent is killed at teardown."""
    path = str(processes.dir / "agent.sock")
    options = {"owner_pid": os.getpid(), "idle_timeout": 60.0, **kwargs}
    info = ensure_agent(path, key=KEY, **options)  # type: ignore[arg-type]
    processes.pids.append(info.pid)
    return path, info.pid


def serving_lines(socket_path: str) -> int:
    """How many agents logged that they serve this socket."""
    return Path(socket_path + ".log").read_text().count(f"serving {socket_path}")


CLIENT = """
import json, sys
from episub.agent import AgentClient
from episub.subscription import Delivery
path, count, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
got = []
with AgentClient(path) as client:
    client.join("t")
    with client.subscribe("t", 8192) as sub:
        print("subscribed", flush=True)
        sys.stdin.readline()  # both are subscribed: go
        for start in range(0, count, 50):
            values = [f"{tag}{i}".encode() for i in range(start, min(count, start + 50))]
            client.publish_batch("t", values)
        while len(got) < 2 * count:
            item = sub.receive(timeout=60)
            if not isinstance(item, Delivery):
                sys.exit(f"unexpected item {item!r}")
            got.append([item.seq, item.value.decode()])
print(json.dumps(got))
"""


def test_the_agent_serves_two_client_processes_publishing_and_subscribing_at_once(
    processes: Processes,
) -> None:
    path, _ = start_agent(processes)
    count = 300
    clients = [processes.python(CLIENT, path, str(count), tag, stdin=True) for tag in "ab"]
    for client in clients:
        assert client.read_line() == "subscribed"
    for client in clients:
        client.write_line("go")
    streams = [json.loads(client.read_line()) for client in clients]
    for client in clients:
        assert client.wait() == 0, client.stderr_text()
    # One node publishes for both, so its seqs number both clients' messages, interleaved.
    expected_values = sorted(f"{tag}{i}" for tag in "ab" for i in range(count))
    for stream in streams:
        assert [seq for seq, _ in stream] == list(range(2 * count))
        assert sorted(value for _, value in stream) == expected_values
    assert streams[0] == streams[1]


def test_the_agent_exits_when_its_owner_process_dies(processes: Processes) -> None:
    owner = processes.python("import time; time.sleep(600)")
    path, pid = start_agent(processes, owner_pid=owner.pid)
    with AgentClient(path) as client:  # a connected client does not keep it alive
        client.join(TOPIC)
        owner.popen.kill()
        owner.wait()
        wait_process_gone(pid)
        with pytest.raises(AgentUnavailable):
            client.inspect()
    assert not os.path.exists(path), "the agent left its socket file behind"
    assert "owner process" in Path(path + ".log").read_text()


def test_owner_files_go_when_the_owner_does_and_stay_when_the_agent_retires_idle(
    processes: Processes,
) -> None:
    """A Spark executor's agent is given its deployment's kept copy (spark_connector): a
    later task may need it to start the agent again after an idle exit, never once the
    executor is gone."""
    owner = processes.python("import time; time.sleep(600)")
    for_owner, for_idle = processes.dir / "owner.kept", processes.dir / "idle.kept"
    for path in (for_owner, for_idle):
        path.write_text("kept")
    first = ensure_agent(
        str(processes.dir / "a.sock"), key=KEY, owner_pid=owner.pid, idle_timeout=60.0,
        owner_files=[str(for_owner)],
    )  # fmt: skip
    idle = ensure_agent(
        str(processes.dir / "b.sock"), key=KEY, owner_pid=os.getpid(), idle_timeout=0.5,
        owner_files=[str(for_idle)],
    )  # fmt: skip
    processes.pids += [first.pid, idle.pid]
    wait_process_gone(idle.pid)
    assert for_idle.exists(), "an idle exit removed a file kept for the owner"
    owner.popen.kill()
    owner.wait()
    wait_process_gone(first.pid)
    assert not for_owner.exists(), "the owner is gone and its file was left behind"


def test_an_idle_agent_exits_and_removes_its_socket(processes: Processes) -> None:
    path, pid = start_agent(processes, idle_timeout=0.5)
    wait_process_gone(pid)
    assert not os.path.exists(path)
    assert "idle for" in Path(path + ".log").read_text()


def test_a_second_ensure_agent_attaches_to_the_running_agent(processes: Processes) -> None:
    path, pid = start_agent(processes)
    again = ensure_agent(path, key=KEY, owner_pid=os.getpid())
    assert again.pid == pid
    assert is_alive(pid)
    assert serving_lines(path) == 1


ENSURE = """
import sys
from episub.agent import ensure_agent
sys.stdin.readline()  # start together
info = ensure_agent(sys.argv[1], key=bytes(range(32)), owner_pid=int(sys.argv[2]),
                    idle_timeout=60.0)
print(info.pid, flush=True)
"""


def test_two_concurrent_ensure_agent_calls_yield_one_agent(processes: Processes) -> None:
    path = str(processes.dir / "agent.sock")
    callers = [processes.python(ENSURE, path, str(os.getpid()), stdin=True) for _ in range(2)]
    for caller in callers:
        caller.write_line("go")
    pids = [int(caller.read_line()) for caller in callers]
    processes.pids.extend(pids)
    assert pids[0] == pids[1]
    assert serving_lines(path) == 1


def test_ensure_agent_replaces_a_stale_socket_file(processes: Processes) -> None:
    path = str(processes.dir / "agent.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)  # a socket file nobody listens on: its agent was SIGKILLed
    stale.close()
    info = ensure_agent(path, key=KEY, owner_pid=os.getpid(), idle_timeout=60.0)
    processes.pids.append(info.pid)
    with AgentClient(path) as client:
        assert client.inspect().pid == info.pid


def test_ensure_agent_says_why_an_agent_could_not_start(processes: Processes) -> None:
    bad_config = processes.dir / "bad.json"
    bad_config.write_text('{"membership": {"c_rand": 0}}')
    with pytest.raises(AgentUnavailable, match="c_rand must be >= 1"):
        ensure_agent(
            str(processes.dir / "agent.sock"),
            key=KEY,
            owner_pid=os.getpid(),
            config_file=str(bad_config),
            python=sys.executable,
        )


def _raw_exchange(path: str, frame: bytes) -> bytes:
    """Send raw bytes on a fresh connection; what comes back before the agent closes it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(WAIT)
    sock.connect(path)
    sock.sendall(frame)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


def test_a_malformed_frame_closes_only_that_client(processes: Processes) -> None:
    path, _ = start_agent(processes)
    with AgentClient(path) as bystander:
        bystander.join(TOPIC)
        assert _raw_exchange(path, b"\xff\xff\xff\xff") == b""  # announces 4 GiB: refused
        assert _raw_exchange(path, b"\x00\x00\x00\x03\xff\xff\xff") == b""  # not protobuf
        bystander.publish(TOPIC, b"still here")
        assert bystander.inspect().stats["agent_malformed_frames"] == 2


def test_a_bad_request_gets_an_error_reply_and_the_connection_stays(
    processes: Processes,
) -> None:
    path, _ = start_agent(processes)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(WAIT)
    sock.connect(path)
    decoder = FrameSplitter(1 << 20)

    def ask(request: pb.Request) -> pb.Response:
        sock.sendall(encode_frame(request))
        while (body := decoder.next_body()) is None:
            decoder.feed(sock.recv(65536))
        return decode_response(body)

    empty = ask(pb.Request(id=7))
    assert (empty.id, empty.error.kind) == (7, "bad_request")
    assert "empty request" in empty.error.message
    reversed_range = ask(
        pb.Request(id=8, read_range=pb.ReadRange(topic=TOPIC, first_seq=5, last_seq=2))
    )
    assert reversed_range.error.message == "need first_seq <= last_seq, not 5..2"
    assert ask(pb.Request(id=9, inspect=pb.Inspect())).node_info.pid > 0
    sock.close()
    with AgentClient(path) as client:
        with pytest.raises(AgentError, match="not joined to topic 'nowhere'") as raised:
            client.publish("nowhere", b"x")
        assert isinstance(raised.value, AgentBadRequest)
        with pytest.raises(AgentError, match="topic name must be"):
            client.join("")
