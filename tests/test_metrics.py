"""`--metrics-port`: a real HTTP scrape of a real `episub node` process reports what it did."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest

from episub.agent import AgentClient
from tests.proc_helpers import TOPIC, node_ready, wait_until

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(120)

MESSAGES = 25


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int, path: str = "/metrics") -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_a_scrape_of_a_node_that_delivered_n_messages_reports_n_delivered(processes):
    config = processes.config_file()
    a_port, b_port = free_port(), free_port()
    a = processes.episub(
        "node", "--socket", str(processes.dir / "a.sock"), "--topic", TOPIC,
        "--config", config, "--metrics-port", str(a_port), name="a",
    )  # fmt: skip
    a_address = node_ready(a)[1]
    b = processes.episub(
        "node", "--socket", str(processes.dir / "b.sock"), "--topic", TOPIC,
        "--config", config, "--bootstrap", a_address, "--metrics-port", str(b_port), name="b",
    )  # fmt: skip
    node_ready(b)
    assert scrape(b_port)[("episub_delivered_total", ())] == 0
    with AgentClient(str(processes.dir / "a.sock")) as client:
        client.publish_batch(TOPIC, [b"m%d" % i for i in range(MESSAGES)])

    wait_until(
        lambda: scrape(b_port)[("episub_delivered_total", ())] >= MESSAGES,
        what="b's scrape to count the deliveries",
    )
    b_metrics, a_metrics = scrape(b_port), scrape(a_port)
    assert b_metrics[("episub_delivered_total", ())] == MESSAGES
    assert a_metrics[("episub_published_total", ())] == MESSAGES
    assert b_metrics[("episub_published_total", ())] == 0
    assert b_metrics[("episub_duplicates_received_total", ())] == 0
    assert b_metrics[("episub_active_view_size", (("topic", TOPIC),))] == 1
    for name in ("grafts_sent", "prunes_sent", "ihave_ids_sent"):
        assert (f"episub_{name}_total", ()) in b_metrics
    assert ("episub_subscribers_lagged", ()) in b_metrics

    def rtt_of_a() -> bool:
        rtts = [k for k in scrape(b_port) if k[0] == "episub_neighbor_rtt_seconds"]
        return any(dict(labels)["peer"] == a_address for _, labels in rtts)

    wait_until(rtt_of_a, what="an RTT to a in b's metrics")


def test_the_endpoint_answers_only_get_metrics(processes):
    port = free_port()
    proc = processes.episub("node", "--metrics-port", str(port), name="n")
    node_ready(proc)
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
    assert error.value.code == 404
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x")
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, timeout=10)
    assert error.value.code == 405
