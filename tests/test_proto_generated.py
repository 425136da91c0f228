"""The checked-in *_pb2.py/.pyi are exactly what scripts/gen_proto.sh makes from the schemas.

Regenerating here, with the same compiler and flags as the script, catches a schema edited
without regenerating, and a generated file edited by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

grpc_tools = pytest.importorskip("grpc_tools", reason="grpcio-tools comes with the dev extra")
from grpc_tools import protoc  # noqa: E402

PACKAGE = Path(__file__).resolve().parent.parent / "episub"
# (directory, schema name): the node wire, and the local agent protocol.
SCHEMAS = [(PACKAGE / "proto", "episub"), (PACKAGE / "agent", "agent")]


@pytest.mark.parametrize(("proto_dir", "name"), SCHEMAS, ids=[name for _, name in SCHEMAS])
def test_checked_in_generated_code_matches_the_schema(
    tmp_path: Path, proto_dir: Path, name: str
) -> None:
    # Same flags as scripts/gen_proto.sh; paths are relative to the include dir, as there.
    args = [
        "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"--python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        str(proto_dir / f"{name}.proto"),
    ]
    assert protoc.main(args) == 0, f"protoc failed on {proto_dir / f'{name}.proto'}"
    generated = (f"{name}_pb2.py", f"{name}_pb2.pyi")
    stale = [g for g in generated if (tmp_path / g).read_bytes() != (proto_dir / g).read_bytes()]
    assert not stale, (
        f"{', '.join(stale)} out of date with {name}.proto: "
        "run `bash scripts/gen_proto.sh` and commit the result"
    )
