#!/usr/bin/env bash
# Regenerates episub/proto/episub_pb2.py and episub_pb2.pyi from episub/proto/episub.proto.
#
# The outputs are checked in, so users need no protoc; tests/test_proto_generated.py fails
# when they drift from the schema. The compiler is the pinned grpcio-tools of the dev extra
# (pyproject.toml), so the same schema always gives the same bytes. Run after editing the
# schema or moving the grpcio-tools/protobuf pins:
#
#     bash scripts/gen_proto.sh
#
# The schema imports no other .proto file, so the generated module has no imports of
# generated siblings and needs no rewriting to live inside the episub.proto package.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m grpc_tools.protoc -I episub/proto --python_out=episub/proto \
    --pyi_out=episub/proto episub/proto/episub.proto
