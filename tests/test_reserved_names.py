"""The names episub keeps for itself (episub/proto/reserved.py) are spelled once, and the
product spells none of them anywhere else."""

import re
from pathlib import Path

from episub.proto import reserved

ROOT = Path(__file__).resolve().parent.parent


def test_sink_and_control_streams_are_internal_and_a_node_id_is_not():
    assert reserved.sink_stream("q", 3, 1) == b"sink/q/3/1"
    assert reserved.is_internal_stream(reserved.sink_stream("q", 0, 0))
    assert reserved.is_internal_stream(reserved.SINK_INDEX_PREFIX + b"q")
    assert not reserved.is_internal_stream(b"127.0.0.1:7000/ab12")
    assert reserved.CONTROL_PREFIX_TEXT.encode() == reserved.CONTROL_PREFIX
    assert reserved.CONFIG_TOPIC_PREFIX.startswith(reserved.INTERNAL_TOPIC_PREFIX)
    assert reserved.CLUSTER_TOPIC.startswith(reserved.INTERNAL_TOPIC_PREFIX)


def test_no_other_product_module_spells_a_reserved_prefix():
    spelled = re.compile(r"""b?["'](_episub[./](?!batch)|sink/)""")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for package in ("episub", "spark_connector")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "reserved.py" and not path.name.endswith("_pb2.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if spelled.search(line.split("#")[0])
    ]
    assert found == []
