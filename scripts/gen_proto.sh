#!/usr/bin/env bash
# Regenerates the protobuf modules from their schemas:
#   episub/proto/episub.proto -> episub/proto/episub_pb2.py/.pyi  (the node wire)
#   episub/agent/agent.proto  -> episub/agent/agent_pb2.py/.pyi   (the local agent protocol)
#
# The outputs are checked in, so users need no protoc; tests/test_proto_generated.py fails
# when they drift from the schema. The compiler is the pinned grpcio-tools of the dev extra
# (pyproject.toml), so the same schema always gives the same bytes. Run after editing a
# schema or moving the grpcio-tools/protobuf pins:
#
#     bash scripts/gen_proto.sh
#
# Neither schema imports another .proto file, so the generated modules have no imports of
# generated siblings and need no rewriting to live inside their packages.
set -euo pipefail
cd "$(dirname "$0")/.."
for dir_and_name in proto:episub agent:agent; do
    dir="episub/${dir_and_name%%:*}"
    name="${dir_and_name##*:}"
    .venv/bin/python -m grpc_tools.protoc -I "$dir" --python_out="$dir" \
        --pyi_out="$dir" "$dir/$name.proto"
done
