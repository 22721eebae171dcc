#!/usr/bin/env bash
# Regenerates the Python stubs from proto/. Output paths follow the proto packages, so the
# generated absolute imports (`from controlplane.v1 import ...`) resolve without rewriting:
#   controlplane.v1 -> controlplane/v1/            sandbox.v1 -> sandbox-image/sandbox/v1/
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-.venv/bin/python}
plugin_dir=$(dirname "$(command -v "$py")")
gen() {  # gen OUT_ROOT PROTO_SUBDIR
  local out=$1 sub=$2
  rm -f "$out/$sub"/*_pb2*.py "$out/$sub"/*_pb2*.pyi
  mkdir -p "$out/$sub"
  "$py" -m grpc_tools.protoc -Iproto \
    --plugin=protoc-gen-mypy="$plugin_dir/protoc-gen-mypy" \
    --plugin=protoc-gen-mypy_grpc="$plugin_dir/protoc-gen-mypy_grpc" \
    --python_out="$out" --mypy_out=quiet:"$out" --grpc_python_out="$out" --mypy_grpc_out=quiet:"$out" \
    proto/"$sub"/*.proto
  touch "$out/$sub/__init__.py" "$out/${sub%/*}/__init__.py"
}
if [ "${1:-}" = "--check" ]; then
  # Generates into a scratch tree and compares with the committed stubs.
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  gen "$tmp/cp" controlplane/v1
  gen "$tmp/sb" sandbox/v1
  if ! diff -r -x __pycache__ "$tmp/cp/controlplane/v1" controlplane/v1 >/dev/null \
     || ! diff -r -x __pycache__ "$tmp/sb/sandbox/v1" sandbox-image/sandbox/v1 >/dev/null; then
    echo "generated stubs are stale: run 'make proto' and commit the result" >&2
    exit 1
  fi
  exit 0
fi
gen . controlplane/v1
gen sandbox-image sandbox/v1
