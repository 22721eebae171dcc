#!/usr/bin/env bash
# Builds the sandbox image from Dockerfile.sandbox and prints its reference. The tag is a hash of
# every input (Dockerfile, .dockerignore, agent sources, the shared opencode_semantics package, pins,
# base image id), so a rebuild with nothing changed only re-tags `ocsb-sandbox:latest` and takes
# seconds. BASE_IMAGE overrides the registry-free base;
# OCSB_IMAGE_TAG names the moving tag instead of `ocsb-sandbox:latest` (parallel checkouts, each with its own).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log() { printf 'build-image: %s\n' "$*" >&2; }

base=${BASE_IMAGE:-$(bash sandbox-image/build-base.sh)}
base_id=$(docker image inspect --format '{{.Id}}' "$base" 2>/dev/null || echo "$base")
bun_version=$(cat sandbox-image/bun-version)

hash=$( {
  echo "$base_id"
  find Dockerfile.sandbox .dockerignore opencode_semantics sandbox-image/requirements.txt sandbox-image/bun-version \
       sandbox-image/node/package.json sandbox-image/node/package-lock.json \
       sandbox-image/sandbox sandbox-image/sandbox_agent sandbox-image/toolhost sandbox-image/pyhost \
       -type f ! -path '*/__pycache__/*' ! -name '*.pyc' | LC_ALL=C sort | xargs sha256sum
} | sha256sum | cut -c1-16)
image="ocsb-sandbox:${hash}"
moving_tag=${OCSB_IMAGE_TAG:-ocsb-sandbox:latest}

stage=build/image
cache=build/cache
mkdir -p "$stage" "$cache"

# Bun and the npm modules are staged even when the image exists: host-side tests run the same Bun,
# @opencode-ai/plugin and zod as the sandbox (tests/unit/custom, the live zod oracles).
if [ ! -x "$cache/bun-$bun_version/package/bin/bun" ]; then
  log "bun $bun_version from npm"
  mkdir -p "$cache/bun-$bun_version"
  (cd "$cache/bun-$bun_version" && npm pack --silent "@oven/bun-linux-x64@$bun_version" >/dev/null \
     && tar -xzf oven-bun-linux-x64-*.tgz && rm -f oven-bun-linux-x64-*.tgz)
fi
cp "$cache/bun-$bun_version/package/bin/bun" "$stage/bun.new" && mv -f "$stage/bun.new" "$stage/bun"

node_key=$(cat sandbox-image/node/package.json sandbox-image/node/package-lock.json | sha256sum | cut -c1-12)
if [ ! -d "$cache/node-$node_key/node_modules" ]; then
  log "@opencode-ai/plugin and zod from npm"
  rm -rf "$cache/node-$node_key" && mkdir -p "$cache/node-$node_key"
  cp sandbox-image/node/package.json sandbox-image/node/package-lock.json "$cache/node-$node_key/"
  (cd "$cache/node-$node_key" && npm install --silent --ignore-scripts --omit=dev --no-audit --no-fund --omit-lockfile-registry-resolved)
fi
if [ "$(cat "$stage/node_modules.key" 2>/dev/null)" != "$node_key" ]; then
  rm -rf "$stage/node_modules" && cp -a "$cache/node-$node_key/node_modules" "$stage/node_modules"
  echo "$node_key" > "$stage/node_modules.key"
fi

if docker image inspect "$image" >/dev/null 2>&1; then
  docker tag "$image" "$moving_tag"
  echo "$image"
  exit 0
fi

log "wheelhouse for CPython 3.11 (manylinux)"
rm -rf "$stage/wheelhouse" && mkdir -p "$stage/wheelhouse"
python3 -m pip download -q --disable-pip-version-check --only-binary=:all: \
  --platform manylinux2014_x86_64 --python-version 3.11 --implementation cp \
  -r sandbox-image/requirements.txt -d "$cache/wheelhouse"
cp "$cache"/wheelhouse/*.whl "$stage/wheelhouse/"
grep -vE '^\s*(#|$)' sandbox-image/requirements.txt > "$stage/wheelhouse/requirements.txt"

log "docker build $image (base $base)"
docker build -q -f Dockerfile.sandbox --build-arg BASE_IMAGE="$base" \
  --label ocsb.image-hash="$hash" -t "$image" -t "$moving_tag" . >/dev/null
echo "$image"
