#!/bin/sh
# Regenerates golden.json from schemas.mjs and cases.json with the real zod 4.1.8 (run from anywhere).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
NODE_PATH="$root/build/image/node_modules" "$root/build/image/bun" "$here/oracle.mjs" "$here/cases.json" > "$here/golden.json.tmp"
mv "$here/golden.json.tmp" "$here/golden.json"
