"""The checked-in episub_pb2.py/.pyi are exactly what scripts/gen_proto.sh makes from the schema.

Regenerating here, with the same compiler and flags as the script, catches a schema edited
without regenerating, and a generated file edited by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

grpc_tools = pytest.importorskip("grpc_tools", reason="grpcio-tools comes with the dev extra")
from grpc_tools import protoc  # noqa: E402

PROTO_DIR = Path(__file__).resolve().parent.parent / "episub" / "proto"
GENERATED = ("episub_pb2.py", "episub_pb2.pyi")


def test_checked_in_generated_code_matches_the_schema(tmp_path: Path) -> None:
    # Same flags as scripts/gen_proto.sh; paths are relative to the include dir, as there.
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        str(PROTO_DIR / "episub.proto"),
    ]
    assert protoc.main(args) == 0, f"protoc failed on {PROTO_DIR / 'episub.proto'}"
    stale = [
        name
        for name in GENERATED
        if (tmp_path / name).read_bytes() != (PROTO_DIR / name).read_bytes()
    ]
    assert not stale, (
        f"{', '.join(stale)} out of date with episub.proto: "
        "run `bash scripts/gen_proto.sh` and commit the result"
    )
