"""Where nodes live (no Spark needed here): an executor's node listens on this host's address
toward the driver, since an executor on another host cannot bind the driver's address; the
deployment travels whole; a driver agent comes back on its old address; a task with only
the deployment's public form starts its agent from the copy a keyed task kept."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import tempfile
from pathlib import Path

import pytest

from episub.agent import AgentClient, AgentUnavailable
from spark_connector.deployment import (
    Deployment,
    driver_client,
    executor_client,
    executor_owner,
    local_address_toward,
    newest_executor_socket,
)
from tests.proc_helpers import KEY, Processes, wait_process_gone


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


# -- the deployment's travels and its agents' restarts (real agent processes, no Spark) ------


def deployment_in(directory: Path, **fields: object) -> Deployment:
    return dataclasses.replace(
        Deployment(
            key_hex=KEY.hex(),
            host="127.0.0.1",
            bootstrap=(),
            driver_socket=str(directory / "driver.sock"),
            driver_pid=os.getpid(),
        ),
        **fields,
    )


@pytest.fixture
def executor_dir(processes: Processes, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's "executor host" temporary directory (its `$TMPDIR`), apart from the
    driver's socket directory: where executor agents must put their files."""
    host_tmp = processes.dir / "executor-tmp"
    host_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(host_tmp))
    return host_tmp / f"episub-{os.getuid()}"


def kill_agent(processes: Processes, socket_path: str) -> int:
    with AgentClient(socket_path) as client:
        pid = client.inspect().pid
    processes.pids.append(pid)  # killed at teardown too, whatever happens here
    os.kill(pid, signal.SIGKILL)
    wait_process_gone(pid)
    return pid


def test_every_field_travels_in_the_json_and_the_public_form_lacks_only_the_key() -> None:
    values = {
        field.name: (
            ("127.0.0.1:1", "127.0.0.1:2") if field.name == "bootstrap"
            else 7 if field.type == "int"
            else 12.5 if "float" in str(field.type)
            else f"{field.name}-value"
        )
        for field in dataclasses.fields(Deployment)
    }  # fmt: skip
    deployment = Deployment(**values)  # type: ignore[arg-type]
    assert Deployment.from_json(deployment.to_json()) == deployment
    public = deployment.public()
    assert public.key_hex == "" and dataclasses.replace(public, key_hex="key_hex-value") == (
        deployment
    )
    assert "key_hex-value" not in public.to_json()


def test_a_driver_agent_started_again_listens_on_its_old_address(processes: Processes) -> None:
    """Executors' nodes know the driver's by its address (their bootstrap): a driver agent
    that retired (Connect) or died comes back where they look for it."""
    deployment = deployment_in(processes.dir)
    with driver_client(deployment) as client:
        address = client.inspect().address
    first = kill_agent(processes, deployment.driver_socket)
    placed = dataclasses.replace(deployment, driver_address=address)
    with driver_client(placed) as client:
        again = client.inspect()
    processes.pids.append(again.pid)
    assert again.pid != first
    assert again.address == address


def test_a_driver_client_checks_the_agent_once_per_process(processes: Processes) -> None:
    """A checked agent is reached with one connection: no inspect() per call (a cfg.set
    paid one, most of its time), and a killed agent is still started again."""
    deployment = deployment_in(processes.dir)
    with driver_client(deployment) as client:
        before = client.inspect().stats["agent_requests"]
    for _ in range(3):
        with driver_client(deployment):
            pass
    with driver_client(deployment) as client:
        info = client.inspect()
    # the first client's inspect, then this one's: nothing in between
    assert info.stats["agent_requests"] == before + 1
    kill_agent(processes, deployment.driver_socket)
    with driver_client(deployment) as client:
        again = client.inspect()
    processes.pids.append(again.pid)
    assert again.pid != info.pid


def test_an_executor_agent_lives_in_its_own_hosts_temporary_directory(
    processes: Processes, executor_dir: Path
) -> None:
    """The deployment comes from the driver, whose temporary directory another host may
    not have: the executor's socket and log go under the executor's own `$TMPDIR`."""
    deployment = deployment_in(processes.dir / "driver-host")
    with executor_client(deployment) as client:
        processes.pids.append(client.inspect().pid)
        assert Path(client.socket_path).parent == executor_dir
    assert sorted(p.suffix for p in executor_dir.glob("exec-*")) == [".lock", ".log", ".sock"]
    assert not (processes.dir / "driver-host").exists()


def test_a_deployment_with_other_settings_gets_an_executor_node_of_its_own(
    processes: Processes, executor_dir: Path
) -> None:
    """A JVM can outlive its session (local mode): a later session whose deployment has
    other settings must get a node started with them, not the earlier session's; a task
    that carries no deployment finds the node started last."""
    first = deployment_in(processes.dir)
    with executor_client(first) as client:
        first_pid = client.inspect().pid
    processes.pids.append(first_pid)
    later = deployment_in(processes.dir, metrics=True)
    with executor_client(later) as client:
        status = client.inspect()
        later_socket = client.socket_path
    processes.pids.append(status.pid)
    assert status.pid != first_pid and status.metrics_url
    with executor_client(first) as client:
        assert client.inspect().pid == first_pid  # the same settings: the same node
    assert newest_executor_socket(str(executor_dir), executor_owner()) == later_socket


def test_a_task_without_a_deployment_finds_no_node_where_none_was_started(
    executor_dir: Path,
) -> None:
    assert newest_executor_socket(str(executor_dir), executor_owner()) is None


def test_a_task_with_only_the_public_deployment_restarts_its_agent_from_the_kept_copy(
    processes: Processes, executor_dir: Path
) -> None:
    """Under Connect a UDF's task finds only the deployment's public form (no key) in its
    job properties; the copy a keyed task kept beside the agent lets it start the agent
    again after the agent died."""
    deployment = deployment_in(processes.dir, id="0123456789ab")
    with executor_client(deployment) as client:
        socket_path = client.socket_path
        first = client.inspect().pid
    processes.pids.append(first)
    [kept] = executor_dir.glob("exec-*-0123456789ab.deployment")
    assert kept.stat().st_mode & 0o777 == 0o600
    assert Deployment.from_json(kept.read_text()) == deployment
    kill_agent(processes, socket_path)
    with executor_client(deployment.public()) as client:
        again = client.inspect().pid
    processes.pids.append(again)
    assert again != first


def test_without_a_kept_copy_the_public_deployment_says_to_call_cluster_config(
    processes: Processes, executor_dir: Path
) -> None:
    public = deployment_in(processes.dir, id="ba9876543210").public()
    with pytest.raises(AgentUnavailable, match=r"cannot start one.*cluster_config\(spark\)"):
        executor_client(public)


def test_kept_copies_of_executors_that_are_gone_are_removed(
    processes: Processes, executor_dir: Path
) -> None:
    no_such_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    executor_dir.mkdir(mode=0o700)
    stale = executor_dir / f"exec-{no_such_pid}-123-aaaaaaaaaaaa.deployment"
    stale.write_text("{}")
    deployment = deployment_in(processes.dir, id="cccccccccccc")
    with executor_client(deployment) as client:
        processes.pids.append(client.inspect().pid)
    assert not stale.exists()
    assert list(executor_dir.glob("exec-*-cccccccccccc.deployment"))
